"""One rank of a real multi-rank checkpoint scenario (launched by torchrun from the tests).

    python -m torch.distributed.run --nproc-per-node N tests/training/ckpt_worker.py SCENARIO DIR

Every rank prints JSON lines ({"event": ..., "rank": ...}) that the tests read. Scenarios:
  unreadable  save, train on, make rank 1's part of the checkpoint unreadable, roll back:
              every rank must fail alike and keep its state, in step
  node_local  every rank gets a directory of its own: refused at start on every rank
  save        save a sharded model once (with its full digest), for a restore elsewhere
  load        restore the newest checkpoint (any saving world size) and print the digest
  forever     asynchronous saves every step until killed (for kill -9 tests)
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

from exporters.training.checkpoint import (
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


def main() -> int:
    dist.init_process_group("gloo")
    scenario, directory = sys.argv[1], Path(sys.argv[2])
    {"unreadable": unreadable, "node_local": node_local, "save": save, "load": load,
     "forever": forever}[scenario](directory)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
