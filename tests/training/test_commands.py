"""Every command type end to end in one process (world size 1), through a real exporter.

The 2-rank agreement is covered by test_ddp_two_nodes.py; here the point is what each
command does to real torch objects and what the exporter reports back per rank.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.net import wait_until
from tests.training.support import exporter
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank.checkpoint import CheckpointManager
from trainwatch.exporters.rank.client import Control, TrainingMonitor

JOB = "commands-job"


def drive(monitor: TrainingMonitor, start: int, until: Any, timeout: float = 20.0
          ) -> tuple[int, list[Control]]:
    """Run a trivial loop of 5 ms steps until `until(controls)` holds, with a deadline.

    Commands arrive by polling, so the loop must keep stepping meanwhile; the sleep is the
    simulated step's duration, not a synchronisation.
    """
    controls: list[Control] = []
    step = start
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        monitor.report(step, loss=0.5)
        control = monitor.step_end(step)
        if control.applied:
            controls.append(control)
            if until(controls):
                return step, controls
        step = control.next_step
        time.sleep(0.005)
    raise AssertionError(f"commands not applied within {timeout}s: {controls}")


def test_builtin_and_registered_commands_apply_and_report_status(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    checkpoints = CheckpointManager(tmp_path / "ckpt", model, optimizer, scheduler)
    with exporter(tmp_path) as exp:
        monitor = TrainingMonitor(rank_info=RankInfo(JOB, 0, 0, 1, 0), optimizer=optimizer,
                                  scheduler=scheduler, checkpoints=checkpoints,
                                  socket_path=str(exp.socket), sync_every=2, flush_interval=0.05,
                                  poll_interval=0.05)
        seen: list[tuple[dict, int]] = []
        monitor.register_command("set_batch_size",
                                 lambda args, step: seen.append((args, step)) or {"ok": True})
        try:
            monitor.report(0, loss=0.5)
            wait_until(lambda: exp.api("GET", f"/v1/jobs/{JOB}/commands").ok, timeout=10,
                       what="job known to the exporter")

            def post(body: dict) -> None:
                response = exp.api("POST", f"/v1/jobs/{JOB}/commands", json=body)
                assert response.status_code == 202, response.text

            post({"id": "rb-none", "type": "rollback"})  # nothing healthy saved yet -> failed
            step, controls = drive(monitor, 1, lambda c: True)
            failed = controls[0].applied[0]
            assert failed["status"] == "failed" and "no healthy checkpoint" in failed["error"]
            assert controls[0].next_step == step + 1 and not controls[0].rolled_back

            post({"id": "ck-1", "type": "checkpoint"})
            post({"id": "lr-1", "type": "scale_lr", "args": {"factor": 0.001, "floor": 0.01}})
            post({"id": "bs-1", "type": "set_batch_size", "args": {"batch_size": 8}})
            step, controls = drive(monitor, step + 1,
                                   lambda c: sum(len(x.applied) for x in c) >= 3)
            applied = {e["id"]: e for c in controls for e in c.applied}
            assert all(e["status"] == "applied" for e in applied.values()), applied
            saved_at = applied["ck-1"]["step"]
            checkpoints.wait()  # the save is asynchronous: committed in the background
            assert checkpoints.newest_healthy()["step"] == saved_at
            assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)  # the floor holds
            assert scheduler.base_lrs == [pytest.approx(0.01)]
            optimizer.step()
            scheduler.step()
            assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)  # cut survives
            assert seen == [({"batch_size": 8}, applied["bs-1"]["step"])]

            with torch.no_grad():
                model.weight.fill_(float("nan"))
            post({"id": "rb-1", "type": "rollback", "args": {"skip_batches": 3}})
            step, controls = drive(monitor, step + 1, lambda c: True)
            control = controls[0]
            assert control.rolled_back and control.skip_batches == 3
            assert control.next_step == saved_at + 1
            assert torch.isfinite(model.weight).all()

            def status(command_id: str) -> dict:
                return exp.api("GET", f"/v1/jobs/{JOB}/commands/{command_id}").json()

            wait_until(lambda: status("rb-1")["status"] == "applied", timeout=10,
                       what="rollback status reported")
            assert status("rb-none")["ranks"]["0"]["status"] == "failed"
            assert status("lr-1")["ranks"]["0"] == {"status": "applied",
                                                    "step": applied["lr-1"]["step"]}
            counts = exp.samples(catalog.TRAINING_COMMANDS_APPLIED, JOB)
            by_command = {dict(k)["command"]: v for k, v in counts.items()}
            assert by_command == {"checkpoint": 1, "scale_lr": 1, "set_batch_size": 1,
                                  "rollback": 1}
            assert exp.by_rank(catalog.TRAINING_ROLLBACKS, JOB) == {"0": 1.0}

            # The exporter restarts (memory lost) and the same command is posted again: the
            # rank must not apply it twice, and must report its earlier outcome again.
            exp.restart()
            wait_until(lambda: exp.api("GET", f"/v1/jobs/{JOB}/commands").ok, timeout=20,
                       what="job known again after reload")
            # (202, or 200 when the rank's recent applied reports reached the new process first)
            again = exp.api("POST", f"/v1/jobs/{JOB}/commands", json={
                "id": "lr-1", "type": "scale_lr", "args": {"factor": 0.001, "floor": 0.01}})
            assert again.status_code in (200, 202), again.text
            optimizer.param_groups[0]["lr"] = 0.5  # so a second application would show
            deadline = time.monotonic() + 20
            while status("lr-1")["status"] != "applied":
                assert time.monotonic() < deadline, status("lr-1")
                step += 1
                monitor.report(step, loss=0.5)
                assert not monitor.step_end(step).applied
                time.sleep(0.005)  # the simulated step's duration
            assert status("lr-1")["ranks"]["0"]["step"] == applied["lr-1"]["step"]
            assert optimizer.param_groups[0]["lr"] == 0.5
        finally:
            monitor.close()


@pytest.mark.parametrize("args", [
    {"factor": float("nan")}, {"factor": 0.5, "floor": float("inf")},
    {"factor": 0.5, "floor": float("nan")},
])
def test_ranks_refuse_non_finite_arguments_whatever_the_source(args: dict) -> None:
    """Issue 25 item 5, rank side: a command learned from a peer rank (not through this
    node's exporter) is validated again before it is applied; NaN passed the schema's bounds
    on the code before the fix."""
    from trainwatch.exporters.contract import commands as cmd

    with pytest.raises(cmd.CommandError, match="finite"):
        cmd.validate({"id": "c1", "type": "scale_lr", "args": args}, cmd.BUILTIN_SCHEMAS)
    custom = {**cmd.BUILTIN_SCHEMAS, "nudge": cmd.DEFAULT_CUSTOM_SCHEMA}
    with pytest.raises(cmd.CommandError, match="finite"):
        cmd.validate({"id": "c2", "type": "nudge", "args": {"by": float("inf")}}, custom)
