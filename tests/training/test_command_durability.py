"""Acceptance 5: commands survive an exporter restart, are applied exactly once across job
restarts, and the remediation action fails when ranks never apply a command.

Real parts: the `training-exporter` (gunicorn) with its SQLite command log, restarted with
kill -9; TrainingMonitor instances in this process as the job's ranks (one per launch), with a
real CheckpointManager whose directory keeps the applied command ids across launches.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import torch

from tests.support.net import free_port, wait_until
from tests.training.support import exporter, write_token
from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank.checkpoint import CheckpointManager
from trainwatch.exporters.rank.client import TrainingMonitor
from trainwatch.remediation.actions import training_command
from trainwatch.remediation.actions.base import ActionContext, ActionError
from trainwatch.remediation.config import Config

JOB = "durable-job"
INFO = RankInfo(JOB, rank=0, local_rank=0, world_size=1, restarts=0)
CUT = {"id": "cut-1", "type": "scale_lr", "args": {"factor": 0.5}}


def rank(exp, ckpt: Path, *, control: bool = True) -> tuple[TrainingMonitor, torch.optim.SGD]:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    manager = CheckpointManager(ckpt, model, optimizer, asynchronous=False)
    manager.resume()
    monitor = TrainingMonitor(rank_info=INFO, optimizer=optimizer, checkpoints=manager,
                              socket_path=str(exp.socket), control=control, sync_every=1,
                              flush_interval=0.05, poll_interval=0.05)
    return monitor, optimizer


def train_until(monitor: TrainingMonitor, done, what: str) -> list[dict]:
    applied: list[dict] = []
    step = [0]

    def one_step() -> bool:
        monitor.report(step[0], loss=0.5)
        applied.extend(monitor.step_end(step[0]).applied)
        step[0] += 1
        return done(applied)

    wait_until(one_step, timeout=60, interval=0.02, what=what)
    return applied


def test_command_survives_exporter_restart_and_is_applied_exactly_once(tmp_path: Path) -> None:
    log, ckpt = tmp_path / "commands.db", tmp_path / "ckpt"
    port, token = free_port(), write_token(tmp_path)
    extra = ("--command-log", str(log))
    with exporter(tmp_path, "a", port=port, token=token, extra=extra) as exp:
        silent, _ = rank(exp, ckpt, control=False)  # reports, never polls
        try:
            silent.report(0, loss=0.5)
            wait_until(lambda: exp.api("GET", f"/v1/jobs/{JOB}/commands").status_code == 200,
                       timeout=30, what="job known to the exporter")
            assert exp.api("POST", f"/v1/jobs/{JOB}/commands", json=CUT).status_code == 202
            exp.proc.kill9()  # before any rank polled it
        finally:
            # The launch ends without a clean finish reaching the exporter (a crash, a
            # restart): a launch that finished cleanly would close the command (issue 28).
            silent.close()
    with exporter(tmp_path, "b", port=port, token=token, extra=extra) as exp:
        monitor, optimizer = rank(exp, ckpt)
        try:
            applied = train_until(monitor, lambda a: a, "command applied after the restart")
            wait_until(lambda: exp.api("GET", f"/v1/jobs/{JOB}/commands/cut-1").json()["status"]
                       == "applied", timeout=30, what="applied status reported")
        finally:
            monitor.close()
        assert [e["id"] for e in applied] == ["cut-1"] and optimizer.param_groups[0]["lr"] == 0.5
        exp.proc.kill9()
    # The job restarts too; the command is posted again (a remediation retry).
    with exporter(tmp_path, "c", port=port, token=token, extra=extra) as exp:
        monitor, optimizer = rank(exp, ckpt)
        try:
            assert optimizer.param_groups[0]["lr"] == 0.5  # the cut is part of the state
            again = exp.api("POST", f"/v1/jobs/{JOB}/commands", json=CUT)
            assert again.status_code == 200 and again.json()["status"] == "applied", again.text
            assert train_until(monitor, lambda a: len(a) > 0 or monitor._seq > 40,
                               "a few steps") == []
        finally:
            monitor.close()
        assert optimizer.param_groups[0]["lr"] == 0.5, "not applied a second time"


def test_remediation_action_fails_when_ranks_never_apply(tmp_path: Path, monkeypatch) -> None:
    with exporter(tmp_path) as exp:
        silent, _ = rank(exp, tmp_path / "ckpt", control=False)
        try:
            silent.report(0, loss=0.5)
            wait_until(lambda: exp.api("GET", f"/v1/jobs/{JOB}/commands").status_code == 200,
                       timeout=30, what="job known to the exporter")
            # Prometheus is not what is tested here: the one real exporter is the job's node.
            monkeypatch.setattr(training_command, "job_instances",
                                lambda ctx, job, action: [exp.url.removeprefix("http://")])
            config = Config(webhook_token="w" * 32, training_exporter_token=exp.token,
                            store_path=tmp_path / "r.db", prometheus_url="http://127.0.0.1:9",
                            alertmanager_url="http://127.0.0.1:9")
            ctx = ActionContext(config, {"training_job": JOB}, "key-1", requests.Session())
            with pytest.raises(ActionError, match="not applied by every rank"):
                training_command.run({"action": "training_command", "command": "scale_lr",
                                      "args": {"factor": 0.5}, "timeout": "3s"}, ctx)
        finally:
            silent.close()
