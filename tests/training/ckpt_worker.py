"""One rank of a real multi-rank checkpoint scenario (launched by torchrun from the tests).

    python -m torch.distributed.run --nproc-per-node N tests/training/ckpt_worker.py SCENARIO DIR

Every rank prints JSON lines ({"event": ..., "rank": ...}) that the tests read. Scenarios:
  unreadable  save, train on, make rank 1's part of the checkpoint unreadable, roll back:
              every rank must fail alike and keep its state, in step
  node_local  every rank gets a directory of its own: refused at start on every rank
  save        save a sharded model once (with its full digest), for a restore elsewhere
  load        restore the newest checkpoint (any saving world size) and print the digest
  forever     asynchronous saves every step until killed (for kill -9 tests)
  killable    MODEL (fsdp|ddp): rank 0 first checks the manifest it finds (every entry
              complete?), then the job resumes from the newest healthy checkpoint and saves
              asynchronously every step (every 4th one unhealthy) until a rank is killed;
              torchrun restarts it in place from the same directory
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from trainwatch.exporters.rank.checkpoint import (
    COMMITTED,
    JOB_FILE,
    MANIFEST,
    CheckpointLayoutError,
    CheckpointManager,
    RollbackFailed,
    shard_digest,
    weights_digest,
)


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, "rank": dist.get_rank(), **fields,
                                 "time": time.time()}) + "\n")
    sys.stdout.flush()


def sharded_model(width: int = 64) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 4))
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    return fully_shard(net)


def train_step(model: nn.Module, optimizer: Any) -> None:
    loss = model(torch.randn(8, 16)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def unreadable(directory: Path) -> None:
    model = sharded_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    manager = CheckpointManager(directory, model, optimizer, asynchronous=False)
    train_step(model, optimizer)
    name = manager.save(1, loss=0.5)
    for _ in range(2):
        train_step(model, optimizer)
    before = (shard_digest(model), torch.get_rng_state().clone(),
              [v.clone() for v in optimizer.state_dict()["state"][0].values()])
    if dist.get_rank() == 1:  # this node lost (or never had) its copy of its part
        (directory / name / "rng-rank1.json").unlink()
    dist.barrier()
    try:
        manager.rollback()
        outcome = "restored"
    except RollbackFailed as exc:
        outcome = f"failed: {exc}"
    after = (shard_digest(model), torch.get_rng_state(),
             list(optimizer.state_dict()["state"][0].values()))
    unchanged = (before[0] == after[0] and torch.equal(before[1], after[1])
                 and all(torch.equal(a, b) for a, b in zip(before[2], after[2], strict=True)))
    train_step(model, optimizer)  # in step: the collectives of the next step still match
    steps = torch.tensor([2 + 1])
    dist.all_reduce(steps)
    emit("result", outcome=outcome, unchanged=unchanged, steps_sum=int(steps.item()))


def node_local(directory: Path) -> None:
    try:
        CheckpointManager(directory / f"node{dist.get_rank()}", sharded_model())
        emit("result", outcome="accepted")
    except CheckpointLayoutError as exc:
        emit("result", outcome="refused", error=str(exc))


def save(directory: Path) -> None:
    model = sharded_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = CheckpointManager(directory, model, optimizer)
    train_step(model, optimizer)
    manager.save(1, loss=0.5)
    manager.close()
    emit("saved", digest=weights_digest(model), world_size=dist.get_world_size())


def load(directory: Path) -> None:
    model = sharded_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = CheckpointManager(directory, model, optimizer)
    restored = manager.resume()
    emit("loaded", step=restored.step if restored else None, digest=weights_digest(model),
         world_size=dist.get_world_size())


def forever(directory: Path) -> None:
    model = sharded_model(width=2048)  # ~0.3 MB per rank per save... and a real write
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    manager = CheckpointManager(directory, model, optimizer, keep=3)
    emit("pid", pid=os.getpid())
    step = 0
    while True:
        train_step(model, optimizer)
        step += 1
        digest = weights_digest(model)
        manager.save(step, loss=0.5)
        emit("saving", step=step, digest=digest)


def complete(directory: Path, entry: dict[str, Any]) -> bool:
    """Everything a restore needs is there: the commit marker, DCP's metadata, the job file
    and every saving rank's RNG file (the shards are named in DCP's metadata: `.distcp`)."""
    path = directory / entry["dir"]
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    ranks = int(entry["world_size"])
    return ({COMMITTED, ".metadata", JOB_FILE} <= names
            and all(f"rng-rank{r}.json" in names for r in range(ranks))
            and sum(name.endswith(".distcp") for name in names) >= 1)


def killable(directory: Path) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if dist.get_rank() == 0:  # before any collective: no rank of this attempt writes yet
        try:
            entries = json.loads((directory / MANIFEST).read_text())["checkpoints"]
        except FileNotFoundError:
            entries = []
        emit("manifest", attempt=attempt, entries=entries,
             incomplete=[e["dir"] for e in entries if not complete(directory, e)])
    if sys.argv[3] == "ddp":
        torch.manual_seed(0)
        model: nn.Module = DistributedDataParallel(
            nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 4)))
    else:
        model = sharded_model(width=512)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    manager = CheckpointManager(directory, model, optimizer, keep=3)
    restored = manager.resume()
    emit("resumed", attempt=attempt, pid=os.getpid(), run=manager._run_id,
         dir=restored.directory if restored else None, digest=weights_digest(model))
    step = restored.step if restored else 0
    while True:
        train_step(model, optimizer)
        step += 1
        digest = weights_digest(model)
        healthy = step % 4 != 0
        # Announced before the save starts: a kill right after it must not lose the digest.
        emit("saving", attempt=attempt, step=step, digest=digest, healthy=healthy)
        manager.save(step, loss=0.5 if healthy else float("nan"))


def main() -> int:
    dist.init_process_group("gloo")
    scenario, directory = sys.argv[1], Path(sys.argv[2])
    {"unreadable": unreadable, "node_local": node_local, "save": save, "load": load,
     "forever": forever, "killable": killable}[scenario](directory)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
