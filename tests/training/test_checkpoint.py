"""Checkpoint manager: atomic saves survive kill -9, retention, manifest, full-state rollback."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import torch

from exporters.training.checkpoint import CheckpointManager, NoHealthyCheckpoint, weights_digest
from tests.support.net import wait_until
from tests.support.procs import ManagedProcess

# Saves step 1, prints its digest, then keeps saving a ~40 MB model until killed.
SAVER = """
import sys, torch
from exporters.training.checkpoint import CheckpointManager, weights_digest
model = torch.nn.Linear(3200, 3200)
manager = CheckpointManager(sys.argv[1], model, keep=2)
manager.save(1, loss=0.5)
print(weights_digest(model), flush=True)
step = 2
while True:
    with torch.no_grad():
        model.weight.add_(1.0)
    manager.save(step, loss=0.5)
    step += 1
"""


def test_kill_9_during_save_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    saver = ManagedProcess([sys.executable, "-c", SAVER, str(directory)], tmp_path / "saver.log",
                           env={"OMP_NUM_THREADS": "1"})
    try:
        first = wait_until(lambda: saver.log_text().strip().splitlines()[0], timeout=60,
                           what="first checkpoint saved")
        # A temp file beside the checkpoints means a save is in progress right now.
        wait_until(lambda: any(directory.glob(".step-*.tmp")), timeout=60, interval=0.001,
                   what="a save in progress")
        saver.kill9()
    finally:
        saver.stop()
    assert any(directory.glob(".*.tmp")), "killed mid-save: the partial file is there"
    manager = CheckpointManager(directory, torch.nn.Linear(3200, 3200), keep=2)
    assert not any(directory.glob(".*.tmp")), "leftovers of a killed save are cleaned up"
    entries = manager.manifest()
    assert entries and all((directory / e["file"]).exists() for e in entries)
    step = manager.rollback()
    assert step >= 1
    with torch.no_grad():
        expected = torch.nn.Linear(3200, 3200)
        expected.load_state_dict(torch.load(directory / f"step-{step:010d}.pt",
                                            weights_only=True)["model"])
    assert weights_digest(manager.model) == weights_digest(expected)
    if step == 1:
        assert weights_digest(manager.model) == first


def test_retention_keeps_newest_n_plus_newest_healthy(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    manager = CheckpointManager(tmp_path, model, keep=2)
    manager.save(10, loss=1.0)
    manager.save(20, loss=0.9)
    for step in (30, 40, 50):
        manager.save(step, loss=float("nan"))
    steps = [(e["step"], e["healthy"]) for e in manager.manifest()]
    assert steps == [(20, True), (40, False), (50, False)]
    assert sorted(p.name for p in tmp_path.glob("step-*.pt")) == [
        "step-0000000020.pt", "step-0000000040.pt", "step-0000000050.pt"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["checkpoints"][1]["loss"] is None  # NaN is not valid JSON: stored as null
    manager.save(60, loss=0.8, healthy=False)  # the caller may veto a checkpoint
    assert manager.newest_healthy()["step"] == 20


def test_rollback_restores_model_optimizer_scheduler_rng_and_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    manager = CheckpointManager(tmp_path, model, optimizer, scheduler)

    def train_step() -> None:
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()

    for _ in range(3):
        train_step()
    random.seed(5)
    manager.save(3, loss=0.1)
    digest, opt_state = weights_digest(model), optimizer.state_dict()["state"][0]["exp_avg"].clone()
    expected_draws = (torch.rand(3), random.random())
    for _ in range(4):
        train_step()
    assert weights_digest(model) != digest
    assert manager.rollback() == 3
    assert weights_digest(model) == digest
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], opt_state)
    assert scheduler.last_epoch == 3 and optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    assert torch.equal(torch.rand(3), expected_draws[0]) and random.random() == expected_draws[1]


def test_rollback_without_a_healthy_checkpoint_fails_clearly(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, torch.nn.Linear(2, 1))
    with pytest.raises(NoHealthyCheckpoint):
        manager.rollback()
    manager.save(1, loss=float("inf"))
    with pytest.raises(NoHealthyCheckpoint):
        manager.rollback()


def test_manifest_cannot_point_outside_the_directory(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, torch.nn.Linear(2, 1))
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 1, "checkpoints": [
        {"step": 1, "file": "../../etc/passwd", "healthy": True}]}))
    with pytest.raises(ValueError, match="unsafe"):
        manager.rollback()
