"""Checkpoint manager in one process: DCP layout, commit marker, retention, full-state rollback,
asynchronous staging, command effects that outlast a rollback, and the health flag fed by
non-finite losses of every kind (float, tensor, numpy) the monitor sees."""

from __future__ import annotations

import contextlib
import json
import random
import socket
from pathlib import Path

import numpy
import pytest
import torch

from tests.support.net import wait_until
from trainwatch.exporters.contract import catalog, wire
from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.node.training.collector import TrainingCollector
from trainwatch.exporters.node.training.store import Store
from trainwatch.exporters.rank.checkpoint import (
    COMMITTED,
    CheckpointManager,
    NoHealthyCheckpoint,
    weights_digest,
)
from trainwatch.exporters.rank.client import TrainingMonitor

INFO = RankInfo("ckpt-unit", rank=0, local_rank=0, world_size=1, restarts=0)


def monitor(manager: CheckpointManager | None = None, **kwargs) -> TrainingMonitor:
    return TrainingMonitor(rank_info=INFO, socket_path=None, control=False,
                           checkpoints=manager, flush_interval=0.01, **kwargs)


@pytest.mark.parametrize("bad", [torch.tensor(float("nan")), numpy.float32("nan"),
                                 torch.tensor(float("inf")), float("nan")],
                         ids=["tensor", "numpy", "tensor-inf", "float"])
def test_nonfinite_loss_of_any_type_marks_the_next_checkpoint_unhealthy(
        tmp_path: Path, bad: object) -> None:
    """Fails on the old code for tensors and numpy scalars: only floats were checked."""
    model = torch.nn.Linear(2, 1)
    manager = CheckpointManager(tmp_path, model, asynchronous=False)
    tw = monitor(manager)
    try:
        tw.report(1, loss=torch.tensor(0.5))
        manager.save(1)
        tw.report(2, loss=bad)
        tw.report(3, loss=torch.tensor(0.4))
        manager.save(3)
        tw.report(4, loss=numpy.float64(0.3))
        manager.save(4)
    finally:
        tw.close()
    assert [(e["step"], e["healthy"]) for e in manager.manifest()] == [
        (1, True), (3, False), (4, True)]
    assert tw.stats()["nonfinite"] == 1


def test_a_saves_mark_is_shipped_before_the_next_step(tmp_path: Path) -> None:
    """CI of stop 45: a rank killed right after a save (a fatal XID) left the exporter without
    that save's mark, because the mark rode on the next step's report; its restart then booked
    the steps up to the checkpoint as discarded (0.76 s against a stopwatch's 0). With the
    shipper's flush interval at an hour, only the save itself can send the mark."""
    path = tmp_path / "r.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(0.2)
        manager = CheckpointManager(tmp_path / "ckpt", torch.nn.Linear(2, 1),
                                    asynchronous=False)
        tw = TrainingMonitor(rank_info=INFO, socket_path=str(path), control=False,
                             checkpoints=manager, flush_interval=3600.0)
        received: list[dict] = []

        def marks_of_step(step: int) -> list | None:
            with contextlib.suppress(TimeoutError):
                received.append(json.loads(sock.recv(1 << 17)))
            marks = [m for d in received for m in d["goodput"]["marks"] if m[0] == step]
            return marks or None

        try:
            for step in range(1, 4):
                tw.report(step, loss=0.5)
            manager.save(3)  # and no step after it: the rank dies here
            mark = wait_until(lambda: marks_of_step(3), timeout=10,
                              what="a datagram carrying the mark of step 3")[-1]
            newest = received[-1]["goodput"]
            assert newest["goodput"] == pytest.approx(mark[1])  # nothing after it to discard
        finally:
            tw.close()


def test_layout_and_commit_marker(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    manager = CheckpointManager(tmp_path, model, torch.optim.SGD(model.parameters(), lr=0.1))
    name = manager.save(7, loss=0.5)
    manager.wait()
    files = {p.name for p in (tmp_path / name).iterdir()}
    assert {".metadata", COMMITTED, "job.json", "rng-rank0.json"} <= files
    assert any(f.endswith(".distcp") for f in files)
    assert manager.manifest()[0] | {"time": 0} == {
        "step": 7, "dir": name, "loss": 0.5, "world_size": 1, "healthy": True, "time": 0}
    # Leftovers of a save killed before its commit are removed at the next start.
    leftover = tmp_path / "step-0000000009-0123456789abcdef-9"
    leftover.mkdir()
    CheckpointManager(tmp_path, model)
    assert not leftover.exists() and (tmp_path / name).exists()


def test_async_save_is_staged_before_the_loop_changes_the_weights(tmp_path: Path) -> None:
    model = torch.nn.Linear(256, 256)
    manager = CheckpointManager(tmp_path, model, asynchronous=True)
    digest = weights_digest(model)
    manager.save(1, loss=0.1)
    with torch.no_grad():  # the loop goes on while the write runs in the background
        model.weight.add_(1.0)
    manager.wait()
    assert manager.failed_saves == 0
    manager.rollback()
    assert weights_digest(model) == digest


def test_async_staging_overlaps_the_step_and_the_optimizer_waits_for_it(tmp_path: Path) -> None:
    model = torch.nn.Linear(512, 512)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    manager = CheckpointManager(tmp_path, model, optimizer, asynchronous=True)
    for step in (1, 2):  # the second save reuses the first one's staging copy
        digest = weights_digest(model)
        manager.save(step, loss=0.1)
        loss = model(torch.randn(4, 512)).pow(2).mean()  # overlaps the copy
        loss.backward()
        optimizer.step()  # the step pre-hook waits for the copy before changing weights
        manager.wait()
        assert manager.failed_saves == 0
        manager.rollback()
        assert weights_digest(model) == digest


def test_a_failed_background_write_is_not_eligible_and_is_reported(tmp_path: Path,
                                                                   caplog) -> None:
    model = torch.nn.Linear(4, 2)
    manager = CheckpointManager(tmp_path, model)
    manager.save(1, loss=0.1)
    manager.wait()
    (tmp_path / f"step-0000000002-{manager._run_id}-1").write_text("a file, not a directory")
    manager.save(2, loss=0.1)
    manager.wait()
    assert manager.failed_saves == 1 and manager.last_failure
    assert [e["step"] for e in manager.manifest()] == [1]
    assert "not eligible for rollback" in caplog.text
    # ...and as a metric: the rank's datagram carries it, the exporter exports it.
    tw = monitor(manager)
    try:
        report = wire.decode(wire.encode({**tw._shipper._header(), "steps": []}))
    finally:
        tw.close()
    store = Store(600)
    store.ingest(report)
    exported = {s.name: s.value for family in TrainingCollector(store, "n").collect()
                for s in family.samples}
    assert exported[catalog.TRAINING_CHECKPOINT_FAILURES] == 1


def test_retention_keeps_newest_n_plus_newest_healthy(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    manager = CheckpointManager(tmp_path, model, keep=2, asynchronous=False)
    manager.save(10, loss=1.0)
    manager.save(20, loss=torch.tensor(0.9))
    for step in (30, 40, 50):
        manager.save(step, loss=float("nan"))
    steps = [(e["step"], e["healthy"]) for e in manager.manifest()]
    assert steps == [(20, True), (40, False), (50, False)]
    assert sorted(p.name[:15] for p in tmp_path.glob("step-*")) == [
        "step-0000000020", "step-0000000040", "step-0000000050"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["checkpoints"][1]["loss"] is None  # NaN is not valid JSON: stored as null
    manager.save(60, loss=0.8, healthy=False)  # the caller may veto a checkpoint
    assert manager.newest_healthy()["step"] == 20


def test_rollback_restores_model_optimizer_scheduler_scaler_rng_and_data(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # initialises the scale tensor, as a real loop does
    manager = CheckpointManager(tmp_path, model, optimizer, scheduler, scaler=scaler)

    def train_step() -> None:
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()

    for _ in range(3):
        train_step()
        manager.state.take_batch()
    random.seed(5)
    numpy.random.seed(6)
    manager.save(3, loss=0.1)
    digest, opt_state = weights_digest(model), optimizer.state_dict()["state"][0]["exp_avg"].clone()
    expected = (torch.rand(3), random.random(), numpy.random.rand())
    for _ in range(4):
        train_step()
        manager.state.take_batch()
    scaler.update(new_scale=2.0)
    assert weights_digest(model) != digest
    restored = manager.rollback()
    assert restored.step == 3 and manager.state.next_batch == 3
    assert weights_digest(model) == digest
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], opt_state)
    assert scheduler.last_epoch == 3 and optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    assert scaler.get_scale() == 1024.0
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
    assert numpy.random.rand() == expected[2]


def test_effects_outlast_rollback_and_restart(tmp_path: Path) -> None:
    """An LR cut and a skip window agreed after a checkpoint survive rolling back to it and a
    restart of the whole job (the effects journal), and a re-posted command is not re-applied."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    manager = CheckpointManager(tmp_path, model, optimizer, asynchronous=False)
    tw = monitor(manager, optimizer=optimizer, sync_every=1)
    try:
        for step in range(3):
            assert tw.next_batch() == step
            tw.report(step, loss=0.5)
            tw.step_end(step)
        manager.save(2, loss=0.5)
        for step in (3, 4):
            tw.next_batch()
            tw.report(step, loss=torch.tensor(float("nan")) if step == 4 else 0.5)
        tw._incoming.append({"id": "cut-1", "type": "scale_lr", "args": {"factor": 0.5}})
        tw._incoming.append({"id": "rb-1", "type": "rollback", "args": {"skip_batches": 3}})
        control = tw.step_end(4)
    finally:
        tw.close()
    assert [e["status"] for e in control.applied] == ["applied", "applied"], control.applied
    assert control.next_step == 3
    assert control.applied[1]["result"]["skipped"] == [4, 7]  # from the first NaN batch
    assert optimizer.param_groups[0]["lr"] == 0.5  # the cut is not undone by the rollback
    assert [manager.state.take_batch() for _ in range(3)] == [3, 7, 8]

    # A restart: fresh objects at the base LR, the same directory.
    model2 = torch.nn.Linear(2, 1)
    optimizer2 = torch.optim.SGD(model2.parameters(), lr=1.0)
    manager2 = CheckpointManager(tmp_path, model2, optimizer2, asynchronous=False)
    assert manager2.resume().step == 2
    assert optimizer2.param_groups[0]["lr"] == 0.5
    assert manager2.state.skip == [[4, 7]] and manager2.state.next_batch == 3
    tw2 = monitor(manager2, optimizer=optimizer2, sync_every=1)
    try:
        tw2._incoming.append({"id": "cut-1", "type": "scale_lr", "args": {"factor": 0.5}})
        control = tw2.step_end(3)
    finally:
        tw2.close()
    assert control.applied == [] and optimizer2.param_groups[0]["lr"] == 0.5
    assert [e["id"] for _, e in tw2._shared.applied_events] == ["cut-1"]  # its outcome re-reported


def test_rollback_without_a_healthy_checkpoint_fails_clearly(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, torch.nn.Linear(2, 1), asynchronous=False)
    with pytest.raises(NoHealthyCheckpoint):
        manager.rollback()
    manager.save(1, loss=float("inf"))
    with pytest.raises(NoHealthyCheckpoint):
        manager.rollback()


def test_manifest_cannot_point_outside_the_directory(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, torch.nn.Linear(2, 1))
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 2, "checkpoints": [
        {"step": 1, "dir": "../../etc", "healthy": True}]}))
    with pytest.raises(RuntimeError, match="unsafe"):
        manager.rollback()
