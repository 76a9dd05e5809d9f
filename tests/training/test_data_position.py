"""Issue 28, points 1 and 2: the data position a rollback skips from, under gradient
accumulation and across a restart, and never a rollback that leaves the weights NaN.

One real process (world size 1), a real CheckpointManager (asynchronous saves, the default)
and a real TrainingMonitor; a "poisoned" batch makes its loss NaN, which, through backward
and SGD, makes every weight NaN, as bad data does. Commands are injected through the
monitor's command queue, as the shipper delivers them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank.checkpoint import CheckpointManager
from trainwatch.exporters.rank.client import TrainingMonitor

pytestmark = pytest.mark.slow


class Job:
    """A tiny regression job: `micro` batches per optimizer step, batch b is seeded by b."""

    def __init__(self, directory: Path, poison: set[int], micro: int = 1) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.checkpoints = CheckpointManager(directory, self.model, self.optimizer)
        self.monitor = TrainingMonitor(
            rank_info=RankInfo("pos-job", 0, 0, 1, 0), optimizer=self.optimizer,
            checkpoints=self.checkpoints, socket_path=None, control=False, sync_every=1,
            flush_interval=0.01)
        self.poison, self.micro = poison, micro
        self.read: list[int] = []
        self.controls: list[Any] = []

    def step(self, step: int, command: dict[str, Any] | None = None,
             save_every: int = 2) -> int:
        """One optimizer step over `micro` batches; returns the next step."""
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        for _ in range(self.micro):
            batch = self.monitor.next_batch()
            self.read.append(batch)
            gen = torch.Generator().manual_seed(batch)
            x = torch.randn(8, 4, generator=gen)
            loss = self.model(x).pow(2).mean()
            if batch in self.poison:
                loss = loss * float("nan")
            (loss / self.micro).backward()
            losses.append(loss.detach())
        self.optimizer.step()
        loss = torch.stack(losses).mean()
        self.monitor.report(step, loss=loss)  # a tensor: recognised on the shipper thread
        if step % save_every == 0:
            self.checkpoints.save(step, loss=float(loss))
        if command is not None:
            self.monitor._incoming.append(command)
        control = self.monitor.step_end(step)
        self.controls.append(control)
        return control.next_step

    def finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.model.parameters())

    def close(self) -> None:
        self.monitor.close()
        self.checkpoints.close()


def rollback(skip: int, command_id: str = "rb-1") -> dict[str, Any]:
    return {"id": command_id, "type": "rollback", "args": {"skip_batches": skip}}


def applied(job: Job) -> dict[str, Any]:
    events = [e for c in job.controls for e in c.applied]
    assert len(events) == 1, events
    return events[0]


def test_gradient_accumulation_skips_from_the_first_micro_batch_of_the_bad_step(
        tmp_path: Path) -> None:
    """Point 1: 3 micro-batches per step; step 5 reads batches 15, 16, 17 and 15 is bad. The
    window starts at 15, not at the step's last micro-batch (17), so the poison is not read
    again and the job trains on with finite weights after one rollback."""
    job = Job(tmp_path / "ckpt", poison={15}, micro=3)
    try:
        step = 0
        while not job.controls or not job.controls[-1].rolled_back:
            step = job.step(step, rollback(3) if step == 5 else None)
        event = applied(job)
        assert event["status"] == "applied", event
        assert event["result"]["restored_step"] == 4
        assert event["result"]["skipped"] == [15, 18], event["result"]
        since = len(job.read)
        while step <= 10:
            step = job.step(step)
        after = job.read[since:]
        assert after[:3] == [18, 19, 20], after  # step 5 again: the first batches after 15-17
        assert 15 not in after and job.finite()
        assert job.monitor.stats()["rollbacks"] == 1
    finally:
        job.close()


def test_rollback_after_a_restart_skips_from_the_journalled_first_bad_batch(
        tmp_path: Path) -> None:
    """Point 2: batch 10 is bad (step 10). That sync step agrees it and journals it (and the
    next checkpoint holds it); the process then dies (no rollback yet) and a new one resumes
    from the step-8 checkpoint. The rollback command (skip 1) arrives at step 9 of the new
    process, which read batch 9, before batch 10 is read again: it skips batch 10 (the
    journalled one, not the batch just read), so the weights stay finite and the command is
    `applied` truthfully."""
    directory = tmp_path / "ckpt"
    first = Job(directory, poison={10})
    step = 0
    while step <= 12:
        step = first.step(step)
    assert not first.finite(), "the poison reached the weights"
    effects = json.loads((directory / "effects.json").read_text())
    assert effects["bad_batch"] == 10, effects
    first.checkpoints.wait()
    newest = first.checkpoints.manifest()[-1]
    assert newest["step"] == 12 and not newest["healthy"]
    job_file = json.loads((directory / newest["dir"] / "job.json").read_text())
    assert job_file["train_state"]["bad_batch"] == 10, "in the checkpoint too"
    first.close()  # the process is gone; what it knew in memory with it

    second = Job(directory, poison={10})
    try:
        restored = second.checkpoints.resume()
        assert restored is not None and restored.step == 8
        assert second.checkpoints.state.bad_batch == 10, "the journal outlives the process"
        step = restored.step + 1
        step = second.step(step, rollback(1), save_every=100)  # reads batch 9
        event = applied(second)
        assert event["status"] == "applied", event
        assert event["result"]["skipped"] == [10, 11], event["result"]
        while step <= 14:
            step = second.step(step, save_every=100)
        assert 10 not in second.read, second.read
        assert second.finite(), "after the rollback the job trains on finite weights"
        assert second.checkpoints.state.bad_batch is None, "used by the rollback"
    finally:
        second.close()


def test_the_step_that_receives_the_command_is_not_taken_for_the_bad_one(
        tmp_path: Path) -> None:
    """Point 2, in one process: NaN at batch 7; losses stay NaN for three more steps; the
    rollback skips from 7 (the first bad batch, kept as training state), not from 10."""
    job = Job(tmp_path / "ckpt", poison={7})
    try:
        step = 0
        while not job.controls or not job.controls[-1].rolled_back:
            step = job.step(step, rollback(2) if step == 10 else None)
        assert job.checkpoints.state.skip == [[7, 9]]
        event = applied(job)
        assert event["result"]["skipped"] == [7, 9] and event["result"]["restored_step"] == 6
        while step <= 12:
            step = job.step(step)
        assert job.finite()
    finally:
        job.close()


def test_a_checkpoint_with_nonfinite_weights_is_never_restored(tmp_path: Path) -> None:
    """Labelled healthy by its losses but holding NaN weights: a rollback passes over it to
    the older finite one and marks it unhealthy, so it never reports success on NaN weights."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    manager = CheckpointManager(tmp_path / "ckpt", model, asynchronous=False)
    try:
        manager.save(2, loss=0.5)
        good = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            model.weight.fill_(float("nan"))
        manager.save(4, loss=0.5)  # the loss said nothing: healthy by its label
        restored = manager.rollback()
        assert restored.step == 2
        assert all(torch.equal(p, g) for p, g in zip(model.parameters(), good, strict=True))
        entries = {e["step"]: e for e in manager.manifest()}
        assert entries[4]["healthy"] is False and entries[2]["healthy"] is True
    finally:
        manager.close()
    assert not math.isnan(float(model.bias))
