"""Issue 28, point 10: what an asynchronous checkpoint holds, with the staging thread held back.

The contract (docs/training.md "What an asynchronous checkpoint holds"): the copy of the
state runs in the background after `save()` returns; every change Trainwatch itself drives
waits for it first (the optimizer step, under a framework's wrapper too; a rollback or
resume; every command, a script's own handlers included), and any other in-place change
must call `wait_staged()` first. Each test holds DCP's staging thread back (its copy waits
on an event released by a timer), so a guard that is missing lets the change reach the
checkpoint every time instead of once in a while.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank.checkpoint import CheckpointManager, weights_digest
from trainwatch.exporters.rank.client import TrainingMonitor

pytestmark = pytest.mark.slow
HOLD_S = 0.5


def hold_staging(manager: CheckpointManager) -> threading.Event:
    """Make the next background copy wait until the returned event is set (by a timer)."""
    stager = manager._stager._state_dict_stager  # type: ignore[union-attr]
    original = stager.stage
    started = threading.Event()

    def held(*args: Any, **kwargs: Any) -> Any:
        started.set()
        threading.Timer(HOLD_S, release.set).start()
        release.wait(30)
        return original(*args, **kwargs)

    release = threading.Event()
    stager.stage = held  # type: ignore[method-assign]
    return started


@pytest.fixture
def job(tmp_path: Path) -> Iterator[tuple[torch.nn.Module, Any, CheckpointManager,
                                          TrainingMonitor]]:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    manager = CheckpointManager(tmp_path / "ckpt", model, optimizer)
    monitor = TrainingMonitor(rank_info=RankInfo("contract", 0, 0, 1, 0), optimizer=optimizer,
                              checkpoints=manager, socket_path=None, control=False,
                              sync_every=1, flush_interval=0.01)
    yield model, optimizer, manager, monitor
    monitor.close()
    manager.close()


def test_a_script_command_that_changes_weights_waits_for_the_copy(job) -> None:
    model, _, manager, monitor = job

    def nudge(args: dict[str, Any], step: int) -> None:
        with torch.no_grad():
            model.weight.add_(1.0)

    monitor.register_command("nudge", nudge)
    digest = weights_digest(model)
    started = hold_staging(manager)
    manager.save(1, loss=0.1)
    assert started.wait(10), "the copy runs in the background"
    monitor._incoming.append({"id": "n-1", "type": "nudge", "args": {}})
    control = monitor.step_end(1)
    assert control.applied[0]["status"] == "applied", control.applied
    manager.wait()
    assert manager.failed_saves == 0, manager.last_failure
    manager.rollback()
    assert weights_digest(model) == digest, "the checkpoint holds the state at save()"


def test_optimizer_step_under_a_framework_wrapper_waits_for_the_copy(tmp_path: Path) -> None:
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    accelerator = accelerate.Accelerator(cpu=True)
    model = torch.nn.Linear(64, 64)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert type(optimizer).__name__ == "AcceleratedOptimizer"
    manager = CheckpointManager(tmp_path / "ckpt", model, optimizer)
    try:
        digest = weights_digest(model)
        started = hold_staging(manager)
        manager.save(1, loss=0.1)
        assert started.wait(10)
        model(torch.randn(4, 64)).pow(2).mean().backward()
        optimizer.step()  # the pre-hook on the torch optimizer inside waits for the copy
        manager.wait()
        assert weights_digest(model) != digest
        manager.rollback()
        assert weights_digest(model) == digest
    finally:
        manager.close()


def test_lr_cut_and_rollback_while_the_copy_is_held(job) -> None:
    model, optimizer, manager, monitor = job
    digest = weights_digest(model)
    started = hold_staging(manager)
    manager.save(1, loss=0.1)
    assert started.wait(10)
    monitor._incoming.append({"id": "lr-1", "type": "scale_lr", "args": {"factor": 0.5}})
    monitor._incoming.append({"id": "rb-1", "type": "rollback", "args": {}})
    control = monitor.step_end(1)
    assert [e["status"] for e in control.applied] == ["applied", "applied"], control.applied
    assert weights_digest(model) == digest
    # the checkpoint's LR is the one at save(); the cut made after it is re-applied once
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


def test_an_own_change_after_wait_staged_is_not_in_the_checkpoint(job) -> None:
    """What the contract asks of a script (and of tests/packaging/test_fresh_install.py)."""
    model, _, manager, _ = job
    digest = weights_digest(model)
    started = hold_staging(manager)
    manager.save(1, loss=0.1)
    assert started.wait(10)
    manager.wait_staged()
    with torch.no_grad():
        model.weight.add_(1.0)
    manager.rollback()
    assert weights_digest(model) == digest
