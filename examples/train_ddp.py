"""A small data-parallel training job instrumented with Trainwatch (CPU/gloo or GPU/NCCL).

    python -m torch.distributed.run --nproc-per-node 2 examples/train_ddp.py \
        --job demo --steps 300 --step-time 0.05 --spike-at-step 100 --checkpoint-dir /tmp/ck

An MLP learns a fixed noisy regression target with SGD and gradient-norm clipping (max 3).
`--spike-at-step N` multiplies the learning rate by `--spike-factor` (20: 0.05 -> 1.0) at
step N: that is past SGD's stability limit on this problem (about 0.7), the clipped updates
keep throwing the weights about, and the loss sits at about 6x its baseline (about 2.9
against 0.46) - high, finite and persistent, because clipping bounds each update without
ever letting it settle. It stays there until something cuts the learning rate, which is
what the Trainwatch stack does with a `scale_lr` command: the shipped playbook's factor 0.5
(lr 0.5) brings it back to about 0.65-0.7 (1.5x) within about 25 steps, factor 0.1 to 0.6.
`--nan-at-step N` makes the loss at step N NaN once, which poisons the weights (every later
loss is NaN) until a `rollback` command restores the newest healthy checkpoint.

`--fault-file PATH` (or $TRAIN_DDP_FAULT_FILE) lets an injector (benchmarks/chaos.py) pick the
moment instead of the command line: the file holds one JSON object, {"id": ..., "kind": "nan"
or "spike"}. Rank 0 stats it every step (a changed mtime or size is read; nothing else is) and
every rank injects a new id's fault at the same step (a broadcast from rank 0, so a spike's
learning rate stays the same on every replica): `nan` as --nan-at-step, `spike` sets the
learning rate to --lr x --spike-factor (not a multiple of the current one, so that repeated
spikes and cuts stay where this docstring says). An id is applied once, also across restarts:
rank 0 appends it to PATH.applied before injecting. Content that is not such an object is
ignored with one log line (stderr) per change of the file.

Every rank prints JSON lines on stdout for demo timelines and tests: start, step (every
--print-every steps), spike_injected, nan_injected (with the fault file's `id` when it came
from there), checkpoint_saved, command_applied
(with the new lr or the restored step and a digest of the restored weights), summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainwatch.exporters.rank import (
    CheckpointManager,
    ModelFlops,
    TrainingMonitor,
    count_parameters,
    shard_digest,
    weights_digest,
)

FEATURES = 16
FAULT_FILE_ENV = "TRAIN_DDP_FAULT_FILE"
FAULT_KINDS = ("nan", "spike")  # index + 1: the code rank 0 broadcasts (0: no fault)


log = logging.getLogger("train_ddp")


def emit(event: str, **fields: Any) -> None:
    """One JSON line per event, written in one call so ranks' lines never interleave."""
    sys.stdout.write(json.dumps({"event": event, **fields, "time": time.time()}) + "\n")
    sys.stdout.flush()


def structured_logging(directory: str | None) -> None:
    """ECS JSON log files per rank (what Filebeat ships and trainwatch-logscan scans), when a
    directory is given by --log-dir or TRAINWATCH_LOG_DIR."""
    if not directory:
        return
    from trainwatch.exporters.rank import AsyncEcsHandler

    log.addHandler(AsyncEcsHandler(directory))
    log.setLevel(logging.INFO)
    log.propagate = False


class FaultTrigger:
    """Rank 0's reader of --fault-file: `poll()` once a step returns a new fault's (id, kind)
    once, else None. Cheap when nothing changed (one stat), because it runs every step; the
    ids already applied are kept in PATH.applied so that a restarted job (requeue, torchrun)
    does not inject the same fault again."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.applied_path = path + ".applied"
        self.seen: tuple[int, int] | None = None  # (mtime_ns, size) last read
        try:
            with open(self.applied_path, encoding="utf-8") as f:
                self.applied = {line.strip() for line in f if line.strip()}
        except FileNotFoundError:
            self.applied = set()

    def poll(self) -> tuple[str, str] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        if (st.st_mtime_ns, st.st_size) == self.seen:
            return None
        self.seen = (st.st_mtime_ns, st.st_size)
        try:
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
            return self._ignore(f"unreadable ({type(exc).__name__}: {exc})")
        if not isinstance(doc, dict):
            return self._ignore("not a JSON object")
        fault_id, kind = doc.get("id"), doc.get("kind")
        if not isinstance(fault_id, str) or not fault_id.strip() or "\n" in fault_id:
            return self._ignore(f"id {fault_id!r} is not a one-line string")
        if kind not in FAULT_KINDS:
            return self._ignore(f"kind {kind!r} is not one of {list(FAULT_KINDS)}")
        if fault_id in self.applied:
            return None
        self.applied.add(fault_id)
        with open(self.applied_path, "a", encoding="utf-8") as f:  # before the injection:
            f.write(fault_id + "\n")  # a crash in between loses the fault, never repeats it
        return fault_id, kind

    def _ignore(self, why: str) -> None:
        """One clear line per change of the file (poll reads a file once per change)."""
        print(f"train_ddp: fault file {self.path} ignored: {why}", file=sys.stderr, flush=True)
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default=None, help="training_job label (default: from env)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-time", type=float, default=0.05,
                        help="pad every step to at least this many seconds")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--clip", type=float, default=3.0, help="max gradient norm")
    parser.add_argument("--spike-at-step", type=int, default=None)
    parser.add_argument("--spike-factor", type=float, default=20.0)
    parser.add_argument("--nan-at-step", type=int, default=None)
    parser.add_argument("--fault-file", default=os.environ.get(FAULT_FILE_ENV),
                        help="inject nan/spike when this JSON file names a new fault id "
                             f"(default: ${FAULT_FILE_ENV}; module docstring)")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--keep-checkpoints", type=int, default=3)
    parser.add_argument("--sync-checkpoints", action="store_true",
                        help="save synchronously (default: asynchronous, staged to CPU)")
    parser.add_argument("--model", choices=("ddp", "fsdp"), default="ddp",
                        help="replicated (DDP) or sharded (FSDP2 fully_shard) model")
    parser.add_argument("--crash-after-rollback", action="store_true",
                        help="exit 1 right after a rollback on the first launch (tests a "
                        "torchrun restart that must keep the rollback's effects)")
    parser.add_argument("--poison-batches", default="",
                        help="comma-separated batch indices whose loss is NaN (bad data)")
    parser.add_argument("--tensorboard-dir", default=None)
    parser.add_argument("--print-every", type=int, default=10)
    parser.add_argument("--log-dir", default=os.environ.get("TRAINWATCH_LOG_DIR"),
                        help="write ECS JSON logs here (default: $TRAINWATCH_LOG_DIR)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: this rank's GPU (LOCAL_RANK) with NCCL where CUDA is "
                             "available, else CPU with gloo")
    args = parser.parse_args(argv)
    if (args.steps < 1 or args.batch_size < 1 or args.lr <= 0 or args.step_time < 0
            or args.clip <= 0 or args.spike_factor <= 0):
        parser.error("--steps, --batch-size, --lr, --clip, --spike-factor must be positive "
                     "and --step-time >= 0")
    if args.checkpoint_every < 1 or args.print_every < 1:
        parser.error("--checkpoint-every and --print-every must be >= 1")
    return args


class Data:
    """Deterministic batches: batch i of rank r is the same on every run (so skips replay)."""

    def __init__(self, seed: int, rank: int, batch_size: int) -> None:
        target = torch.Generator().manual_seed(seed)
        self.w1 = torch.randn(FEATURES, 32, generator=target)
        self.w2 = torch.randn(32, 1, generator=target) / 4
        self.seed, self.rank, self.batch_size = seed, rank, batch_size

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rank * 7919 + index)
        x = torch.randn(self.batch_size, FEATURES, generator=gen)
        y = torch.tanh(x @ self.w1) @ self.w2 + 0.1 * torch.randn(self.batch_size, 1,
                                                                   generator=gen)
        return x, y


def pick_device(choice: str) -> torch.device:
    """The rank's own GPU (LOCAL_RANK) when CUDA is used, else the CPU. NCCL only works on
    CUDA tensors: a model left on the CPU under NCCL fails in DDP's constructor with "No
    backend type associated with device type cpu" (seen on an H100 host)."""
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available on this host")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    distributed = "RANK" in os.environ
    device = pick_device(args.device)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    structured_logging(args.log_dir)
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    net = nn.Sequential(nn.Linear(FEATURES, 64), nn.LeakyReLU(0.1), nn.Linear(64, 1)).to(device)
    model: nn.Module = net
    if distributed and args.model == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        model = fully_shard(net)
    elif distributed:
        device_ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(net, device_ids=device_ids)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = Data(args.seed, rank, args.batch_size)
    poison = {int(b) for b in args.poison_batches.split(",") if b.strip()}

    checkpoints = (CheckpointManager(args.checkpoint_dir, model, optimizer,
                                     keep=args.keep_checkpoints,
                                     asynchronous=not args.sync_checkpoints)
                   if args.checkpoint_dir else None)
    monitor = TrainingMonitor(job=args.job, optimizer=optimizer, checkpoints=checkpoints,
                              tensorboard_dir=args.tensorboard_dir,
                              cuda_device=device.index if device.type == "cuda" else None)
    # MFU: an MLP does 2N FLOPs per sample forward and 4N backward (the 6N rule, one sample
    # being one "token"); fp32 matmuls. The peak comes from the GPU's datasheet row.
    monitor.set_model_flops(ModelFlops(per_sample=6.0 * count_parameters(net)), dtype="fp32")

    def set_batch_size(cmd_args: dict[str, Any], step: int) -> dict[str, Any]:
        """A script-defined command: the stack can shrink the batch (e.g. after an OOM)."""
        data.batch_size = int(cmd_args["batch_size"])
        return {"batch_size": data.batch_size}

    monitor.register_command("set_batch_size", set_batch_size, schema={
        "type": "object", "properties": {"batch_size": {"type": "integer", "minimum": 1,
                                                         "maximum": 65536}},
        "required": ["batch_size"], "additionalProperties": False})

    step = 0
    restored = checkpoints.resume() if checkpoints is not None else None
    if restored is not None:  # an elastic restart resumes where it left off
        step = restored.step + 1
        emit("resumed", rank=rank, step=step, next_batch=checkpoints.state.next_batch,
             skip=checkpoints.state.skip, lr=optimizer.param_groups[0]["lr"],
             weights_sha256=weights_digest(model), shard_sha256=shard_digest(model))
    emit("start", rank=rank, world_size=world, job=monitor.info.job, step=step,
         restarts=monitor.info.restarts)
    spiked = nan_done = False
    trigger = FaultTrigger(args.fault_file) if args.fault_file and rank == 0 else None
    fault_code = torch.zeros(1, dtype=torch.int64, device=device)
    fault_id = ""
    loss_value = float("nan")
    steps_run = 0
    while step < args.steps:
        started = time.perf_counter()
        batch = monitor.next_batch()  # the data position, past skipped ranges
        x, y = data.batch(batch)  # generated on the CPU: the same on any device
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        data_wait = time.perf_counter() - started
        triggered = ""  # the fault file's kind this step, on every rank
        if args.fault_file:
            found = trigger.poll() if trigger is not None else None
            fault_code.fill_(FAULT_KINDS.index(found[1]) + 1 if found else 0)
            if found:
                fault_id = found[0]
            if distributed:  # every rank injects at this same step
                dist.broadcast(fault_code, src=0)
            code = int(fault_code.item())
            triggered = FAULT_KINDS[code - 1] if code else ""
        if triggered == "spike":
            for group in optimizer.param_groups:
                group["lr"] = args.lr * args.spike_factor
            emit("spike_injected", rank=rank, step=step, lr=optimizer.param_groups[0]["lr"],
                 id=fault_id or None)
            log.warning("learning rate set to %s at step %d (injected spike)",
                        optimizer.param_groups[0]["lr"], step)
        if step == args.spike_at_step and not spiked:
            spiked = True
            for group in optimizer.param_groups:
                group["lr"] *= args.spike_factor
            emit("spike_injected", rank=rank, step=step, lr=optimizer.param_groups[0]["lr"])
            log.warning("learning rate multiplied by %s at step %d (injected spike)",
                        args.spike_factor, step)
        loss = nn.functional.mse_loss(model(x), y)
        if step == args.nan_at_step and not nan_done:
            nan_done = True
            loss = loss * float("nan")
            emit("nan_injected", rank=rank, step=step)
        if triggered == "nan":
            loss = loss * float("nan")
            emit("nan_injected", rank=rank, step=step, id=fault_id or None)
        if batch in poison:
            loss = loss * float("nan")
            emit("poison_read", rank=rank, step=step, batch=batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        was_finite = math.isfinite(loss_value) or steps_run == 0
        loss_value = loss.item()
        if was_finite and not math.isfinite(loss_value):  # once per streak, not every step
            log.error("loss is %s at step %d", loss_value, step)
        if hasattr(grad_norm, "full_tensor"):  # sharded (FSDP2): a DTensor
            grad_norm = grad_norm.full_tensor()
        monitor.report(step, loss=loss.detach(), grad_norm=grad_norm.detach(),  # off-thread
                       samples=data.batch_size, data_wait=data_wait)
        if step % args.print_every == 0:
            emit("step", rank=rank, step=step, loss=loss_value, batch=batch,
                 lr=optimizer.param_groups[0]["lr"])
        if checkpoints is not None and step > 0 and step % args.checkpoint_every == 0:
            name = checkpoints.save(step, loss=loss_value)
            emit("checkpoint_saved", rank=rank, step=step, finite=math.isfinite(loss_value),
                 dir=name, weights_sha256=weights_digest(model),
                 shard_sha256=shard_digest(model))
        control = monitor.step_end(step)
        for event in control.applied:
            extra: dict[str, Any] = {}
            if event["type"] == "rollback":  # every rank, applied or failed: a collective
                extra["weights_sha256"] = weights_digest(model)
                extra["shard_sha256"] = shard_digest(model)
            log.info("command %s (%s) %s at step %d: %s", event["id"], event["type"],
                     event["status"], step, event.get("result") or event.get("error"))
            emit("command_applied", rank=rank, step=step, id=event["id"], type=event["type"],
                 status=event["status"], result=event.get("result"), error=event.get("error"),
                 lr=optimizer.param_groups[0]["lr"], **extra)
            if (event["type"] == "rollback" and event["status"] == "applied"
                    and args.crash_after_rollback and monitor.info.restarts == 0):
                monitor.close()
                os._exit(1)  # a crash: torchrun restarts every rank
        step = control.next_step
        steps_run += 1
        remaining = args.step_time - (time.perf_counter() - started)
        if remaining > 0:
            time.sleep(remaining)

    monitor.close()
    if checkpoints is not None:
        checkpoints.close()
    log.info("finished at step %d", step - 1)
    emit("summary", rank=rank, steps_run=steps_run, final_step=step - 1, final_loss=loss_value,
         lr=optimizer.param_groups[0]["lr"], next_batch=monitor.train_state.next_batch,
         skip=monitor.train_state.skip, weights_sha256=weights_digest(model),
         failed_saves=checkpoints.failed_saves if checkpoints else 0, **monitor.stats())
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:
        # the moment this rank stopped training (a peer's death reaches it as an error from
        # the collective), before the interpreter's teardown: the tests' stopwatch
        emit("failed", rank=int(os.environ.get("RANK", "0")),
             error=f"{type(exc).__name__}: {exc}"[:300])
        raise
