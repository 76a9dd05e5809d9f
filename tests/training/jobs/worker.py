"""A minimal real multi-rank job for the hang, restart and identity tests (gloo on CPU).

Each step is one all-reduce (the stand-in for DDP's gradient sync; with --side-group on a
second gloo group of all ranks, as a checkpoint's or a pipeline's collectives are), then
`report` and `step_end`. Faults are injected by rank and step: block before the all-reduce
(--hang-rank), or enter another collective than the peers (--hang-in pair: an all-reduce on a
group of the rank and its neighbour, which waits in the step's all-reduce), exit, or SIGKILL
itself. Every rank prints JSON event lines: start, applied (a command it applied), finished.

    python -m torch.distributed.run --nproc-per-node 4 ... worker.py --steps 0 \
        --hang-rank 2 --hang-at-step 30
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from trainwatch.exporters.rank.client import TrainingMonitor


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields, "time": time.time()}) + "\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0, help="0: until killed")
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--sync-every", type=int, default=2)
    parser.add_argument("--hang-rank", type=int, default=None)
    parser.add_argument("--hang-at-step", type=int, default=None)
    parser.add_argument("--exit-rank", type=int, default=None, help="dies (first attempt only)")
    parser.add_argument("--exit-at-step", type=int, default=None)
    parser.add_argument("--kill-rank", type=int, default=None, help="SIGKILLs itself")
    parser.add_argument("--kill-at-step", type=int, default=None)
    parser.add_argument("--slow-rank", type=int, default=None,
                        help="this rank's own work (the sleep between steps) takes longer")
    parser.add_argument("--slow-factor", type=float, default=1.0)
    parser.add_argument("--side-group", action="store_true",
                        help="the step's all-reduce runs on a second group of all ranks")
    parser.add_argument("--hang-in", choices=("nothing", "pair"), default="nothing",
                        help="where --hang-rank hangs: before the all-reduce, or inside "
                        "another collective than its peers'")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    # every rank creates every group, in the same order (new_group is collective)
    step_group = dist.new_group(backend="gloo") if args.side_group else None
    pair = (dist.new_group([r for r in range(world) if r // 2 == (args.hang_rank or 0) // 2],
                           backend="gloo") if args.hang_in == "pair" else None)
    monitor = TrainingMonitor(sync_every=args.sync_every, flush_interval=0.05,
                              poll_interval=0.1)
    monitor.register_command("mark", lambda cmd_args, step: {"rank": rank})
    emit("start", rank=rank, job=monitor.info.job, world_size=monitor.info.world_size,
         restarts=monitor.info.restarts, incarnation=monitor.incarnation, pid=os.getpid())
    tensor = torch.ones(1)
    step = 0
    while args.steps == 0 or step < args.steps:
        if rank == args.hang_rank and step == args.hang_at_step:
            emit("hanging", rank=rank, step=step, pid=os.getpid())
            if pair is not None:  # its partner waits in the step's all-reduce: forever
                dist.all_reduce(torch.ones(1), group=pair)
            threading.Event().wait()  # blocks forever before the collective below
        if rank == args.kill_rank and step == args.kill_at_step:
            emit("killing", rank=rank, step=step, pid=os.getpid())
            os.kill(os.getpid(), signal.SIGKILL)
        if (rank == args.exit_rank and step == args.exit_at_step
                and monitor.info.restarts == 0):
            emit("exiting", rank=rank, step=step)
            os._exit(1)
        dist.all_reduce(tensor, group=step_group)
        monitor.report(step, loss=1.0 / (step + 1), samples=8)
        control = monitor.step_end(step)
        for event in control.applied:
            emit("applied", rank=rank, id=event["id"], step=event["step"],
                 status=event["status"])
        step = control.next_step
        time.sleep(args.step_time * (args.slow_factor if rank == args.slow_rank else 1.0))
    monitor.close()
    emit("finished", rank=rank, step=step)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
