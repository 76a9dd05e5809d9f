"""A real multi-rank job that spends its time on every goodput cause (gloo on CPU).

Each step: fetch a batch (slow for `--slow-data-steps`), forward, backward, an all-reduce of
the gradients (so a stalled rank holds the others), optimizer step, padding to
`--step-time`, `report`, a synchronous checkpoint save at `--save-at` steps, `step_end`
(where a posted rollback is applied). The job measures, with its own clock, everything the
test compares the exporter's counters with, and prints it as JSON lines: start (pid),
resumed (restore seconds), step (perf_counter and Unix time of each report, data wait),
saved (save seconds), rolled_back (step_end seconds, restored step), stalled (seconds
slept), closed (Unix time the monitor closed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainwatch.exporters.rank.checkpoint import CheckpointManager
from trainwatch.exporters.rank.client import TrainingMonitor


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def steps_in(spec: str) -> set[int]:
    """'20-29' or '5' -> the steps it names ('' -> none)."""
    if not spec:
        return set()
    low, _, high = spec.partition("-")
    return set(range(int(low), int(high or low) + 1))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--slow-data-steps", default="")
    parser.add_argument("--data-delay", type=float, default=0.0)
    parser.add_argument("--save-at", default="")
    parser.add_argument("--stall-rank", type=int, default=None)
    parser.add_argument("--stall-at-step", type=int, default=None)
    parser.add_argument("--stall-seconds", type=float, default=0.0)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--flush-interval", type=float, default=0.05,
                        help="the monitor's; 0: its default (the first datagram may then "
                        "come after the first step)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    emit("start", rank=rank, pid=os.getpid())
    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    checkpoints = CheckpointManager(args.checkpoint_dir, model, optimizer, keep=10,
                                    asynchronous=False)
    timing = {"flush_interval": args.flush_interval} if args.flush_interval else {}
    monitor = TrainingMonitor(optimizer=optimizer, checkpoints=checkpoints, sync_every=2,
                              poll_interval=0.1, **timing)
    began = time.perf_counter()
    restored = checkpoints.resume()
    emit("resumed", rank=rank, seconds=time.perf_counter() - began,
         step=restored.step if restored else None, restarts=monitor.info.restarts)
    slow, saves = steps_in(args.slow_data_steps), {int(s) for s in args.save_at.split(",") if s}
    step = restored.step + 1 if restored else 0
    generator = torch.Generator().manual_seed(rank)
    while step < args.steps:
        started = time.perf_counter()
        if step in slow:
            time.sleep(args.data_delay)
        x = torch.randn(32, 16, generator=generator)
        data_wait = time.perf_counter() - started
        if (rank == args.stall_rank and step == args.stall_at_step
                and monitor.info.restarts == 0):
            began = time.perf_counter()
            time.sleep(args.stall_seconds)
            emit("stalled", rank=rank, step=step, seconds=time.perf_counter() - began)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
        optimizer.step()
        remaining = args.step_time - (time.perf_counter() - started)
        if remaining > 0:
            time.sleep(remaining)
        monitor.report(step, loss=loss.item(), data_wait=data_wait)
        emit("step", rank=rank, step=step, perf=time.perf_counter(), wall=time.time(),
             data_wait=data_wait)
        if step in saves:
            began = time.perf_counter()
            checkpoints.save(step)
            emit("saved", rank=rank, step=step, seconds=time.perf_counter() - began)
        began = time.perf_counter()
        control = monitor.step_end(step)
        if control.rolled_back:
            emit("rolled_back", rank=rank, step=step, seconds=time.perf_counter() - began,
                 restored=control.next_step - 1)
        step = control.next_step
    monitor.close()
    emit("closed", rank=rank, wall=time.time())
    checkpoints.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
