"""Acceptance 1: a real Alertmanager (rendered from the shipped template) delivers to a real
remediation-server, and each shipped playbook runs once for its alert.

Real parts: Prometheus, Alertmanager, remediation-server (gunicorn), the node training exporter
(`training-exporter`) with a real 2-rank torchrun job (examples/train_ddp.py) for the training
playbooks, ansible-runner on localhost, the GPU power-limit tool (on the fake NVML: there is no
GPU here), py-spy against a second real 2-rank job that stalls, and a real directory tree for
disk cleanup. The only stand-in is the pager (an HTTP server on loopback that records pages).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.remediation.helpers import (
    CONTROL_TOKEN,
    REPO,
    TOKEN,
    VENV_BIN,
    StubState,
    stub_server,
    write_config,
)
from tests.remediation.processes import RunningService, start_service
from tests.support.alertmanager_config import render_one
from tests.support.net import free_port, wait_until
from tests.support.procs import ManagedProcess, alertmanager, prometheus, running
from tests.support.stack import torchrun_argv

JOB = "e2ejob"
STALLED = "stalledjob"
NODE = "127.0.0.1"  # what the rules' `node` label is for exporters scraped at 127.0.0.1:port
DAY = 86400


@dataclass
class Env:
    workdir: Path
    am: str
    service: RunningService
    pager: StubState
    cleanup_root: Path
    scenario: Path
    prometheus: str
    job: ManagedProcess
    job_environment: dict[str, str]

    def job_events(self, event: str) -> list[dict[str, Any]]:
        out = []
        for line in self.job.log_text().splitlines():
            if line.startswith("{") and f'"event": "{event}"' in line:
                out.append(json.loads(line))
        return out


def _disk_tree(root: Path) -> None:
    ckpt = root / "ckpt"
    ckpt.mkdir(parents=True)
    entries = []
    for step, healthy in ((100, True), (200, True), (300, False), (400, False), (500, False),
                          (600, False)):
        name = f"step-{step:06d}.pt"
        (ckpt / name).write_bytes(b"x" * 1000)
        entries.append({"step": step, "loss": 1.0, "healthy": healthy, "path": name})
    (ckpt / "manifest.json").write_text(json.dumps({"checkpoints": entries}))
    old = time.time() - 10 * DAY
    for sub, name, age in (("logs", "old.log", old), ("logs", "new.log", None),
                           ("cache", "old.bin", old)):
        (root / sub).mkdir(exist_ok=True)
        path = root / sub / name
        path.write_bytes(b"y" * 500)
        if age:
            os.utime(path, (age, age))
    outside = root.parent / "outside-victim.log"
    outside.write_bytes(b"must survive")
    os.utime(outside, (old, old))
    (root / "logs" / "link-to-outside.log").symlink_to(outside)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, real_binaries: dict) -> Iterator[Env]:
    workdir = tmp_path_factory.mktemp("am-delivery")
    cleanup_root = workdir / "node-data"
    _disk_tree(cleanup_root)
    scenario = workdir / "gpus.json"
    scenario.write_text(json.dumps({"gpus": [{
        "name": "Fake H100", "uuid": "GPU-e2e0", "power_limit_mw": 300000,
        "power_min_mw": 100000, "power_max_mw": 350000, "power_default_mw": 300000}]}))
    control_token = workdir / "control.token"
    control_token.write_text(CONTROL_TOKEN)
    control_token.chmod(0o600)
    with ExitStack() as stack:
        pager_hostport, pager = stack.enter_context(stub_server())
        exporter_port = free_port()
        exporter_hostport = f"127.0.0.1:{exporter_port}"
        socket_path = workdir / "training.sock"
        stack.enter_context(running(
            [str(VENV_BIN / "training-exporter"), "--bind", "127.0.0.1", "--port",
             str(exporter_port), "--socket", str(socket_path), "--token-file",
             str(control_token), "--node", NODE],
            workdir / "training-exporter.log", ready_url=f"http://{exporter_hostport}/metrics"))
        job_env = {"TRAINWATCH_EXPORTER_SOCKET": str(socket_path),
                   "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        job = stack.enter_context(running(
            torchrun_argv(REPO / "examples" / "train_ddp.py", "--job", JOB, "--steps", "100000",
                          "--step-time", "0.05", "--checkpoint-dir", str(workdir / "ckpt"),
                          "--checkpoint-every", "10", "--print-every", "1000"),
            workdir / "train.log", env={**job_env, "TRAINWATCH_JOB": JOB}, cwd=REPO))
        prom_cfg = workdir / "prometheus.yml"
        prom_cfg.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "training",
                                "static_configs": [{"targets": [exporter_hostport]}]}]}))
        prom_url = stack.enter_context(prometheus(workdir, prom_cfg))
        port = free_port()
        token_file = workdir / "webhook.token"
        token_file.write_text(TOKEN)
        am_cfg = render_one({
            "alertmanager_remediation_url": f"http://127.0.0.1:{port}/v1/alerts",
            "alertmanager_remediation_token_file": str(token_file),
            "alertmanager_group_wait": "1s", "alertmanager_group_interval": "1s",
            "alertmanager_repeat_interval": "1h"}, workdir / "alertmanager-render")
        am_url = stack.enter_context(alertmanager(workdir, am_cfg))
        inventory = workdir / "inventory.yml"
        inventory.write_text(yaml.safe_dump({"all": {"hosts": {NODE: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "trainwatch_python": sys.executable,
            "trainwatch_cleanup_allowed_roots": [str(cleanup_root)],
            "trainwatch_cleanup_checkpoint_dirs": [str(cleanup_root / "ckpt")],
            "trainwatch_cleanup_log_dirs": [str(cleanup_root / "logs")],
            "trainwatch_cleanup_cache_dirs": [str(cleanup_root / "cache")],
            "trainwatch_fake_nvml": str(scenario),
            "trainwatch_power_limit_state_file": str(workdir / "power-state.json"),
        }}}}))
        config = write_config(workdir, port=port, prometheus_url=prom_url,
                              alertmanager_url=am_url, ansible_inventory=str(inventory),
                              pager_url=f"http://{pager_hostport}/page")
        (workdir / "control.token").write_text(CONTROL_TOKEN)  # write_config rewrote it
        service = stack.enter_context(start_service(config, port))
        wait_until(lambda: requests.get(f"{prom_url}/api/v1/query", params={
            "query": f'training_step{{training_job="{JOB}"}}'}, timeout=5).json()["data"][
            "result"], timeout=120, what="Prometheus to see the training job")
        yield Env(workdir, am_url, service, pager, cleanup_root, scenario, prom_url, job,
                  job_env)


def fire(env: Env, labels: dict[str, str], *, resolve: bool = False) -> None:
    """Post an alert to Alertmanager the way Prometheus does."""
    now = datetime.now(timezone.utc)
    body: dict[str, Any] = {"labels": labels, "annotations": {"summary": "acceptance test"},
                            "generatorURL": "http://prometheus.test/graph"}
    if resolve:
        body["endsAt"] = (now - timedelta(seconds=1)).isoformat()
    resp = requests.post(f"{env.am}/api/v2/alerts", json=[body], timeout=5)
    assert resp.status_code == 200, resp.text


def audit_for(env: Env, playbook: str, decision: str, count: int = 1,
              timeout: float = 60) -> list[dict[str, Any]]:
    def found() -> list[dict[str, Any]] | None:
        rows = [r for r in env.service.actions(limit=5000)["audit"]
                if r["playbook"] == playbook and r["decision"] in (decision, "failed")]
        failed = [r for r in rows if r["decision"] == "failed"]
        if failed:
            raise AssertionError(f"{playbook} failed: {failed[0]['reason']}")
        return rows if len(rows) >= count else None

    return wait_until(found, timeout=timeout, what=f"{playbook} {decision}")


def applied(env: Env, command_type: str, count: int = 2) -> list[dict[str, Any]]:
    """`command_applied` lines of the job's ranks for one command type (one per rank)."""
    def found() -> list[dict[str, Any]] | None:
        events = [e for e in env.job_events("command_applied") if e["type"] == command_type]
        return events if len(events) >= count else None

    return wait_until(found, timeout=90, what=f"{command_type} applied by both ranks:\n"
                      + env.job.log_text()[-1500:])


def test_an_alert_without_a_playbook_is_delivered_and_recorded_unmatched(env: Env) -> None:
    """Every alert reaches the webhook (no route lists the playbooks' alerts), so a new
    playbook needs no Alertmanager change; the others are recorded, not lost."""
    fire(env, {"alertname": "TargetDown", "job": "logscan", "instance": "h1:9447",
               "severity": "warning", "component": "stack"})
    def recorded() -> list[dict[str, Any]]:
        return [r for r in env.service.actions(limit=5000)["audit"]
                if r["decision"] == "unmatched" and r["alertname"] == "TargetDown"]

    wait_until(recorded, timeout=60, what="TargetDown recorded as unmatched")


def test_lr_reduction_cuts_lr_on_both_ranks_at_the_same_step(env: Env) -> None:
    fire(env, {"alertname": "TrainingLossSpike", "training_job": JOB, "severity": "warning",
               "component": "training"})
    audit_for(env, "lr_reduction", "acted")
    events = applied(env, "scale_lr")
    assert sorted(e["rank"] for e in events) == [0, 1]
    assert len({e["step"] for e in events}) == 1  # same step on every rank
    assert len({e["id"] for e in events}) == 1 and all(e["status"] == "applied" for e in events)
    assert all(abs(e["lr"] - 0.025) < 1e-9 for e in events)  # 0.05 * 0.5


def test_checkpoint_rollback_rolls_back_then_cuts_lr(env: Env) -> None:
    earlier_cuts = len([e for e in env.job_events("command_applied") if e["type"] == "scale_lr"])
    fire(env, {"alertname": "TrainingNonFiniteLoss", "training_job": JOB,
               "severity": "critical", "component": "training"})
    audit_for(env, "checkpoint_rollback", "acted")
    rollbacks = applied(env, "rollback")
    assert sorted(e["rank"] for e in rollbacks) == [0, 1]
    assert len({e["step"] for e in rollbacks}) == 1
    assert len({e["weights_sha256"] for e in rollbacks}) == 1  # replicas identical after it
    # This playbook's own cut, on both ranks, whatever other tests of the module did before.
    cuts = applied(env, "scale_lr", count=earlier_cuts + 2)[earlier_cuts:]
    assert sorted(e["rank"] for e in cuts) == [0, 1]
    assert len({e["id"] for e in cuts}) == 1


def test_disk_cleanup_keeps_newest_and_newest_healthy_only_under_allowed_roots(env: Env) -> None:
    fire(env, {"alertname": "NodeDiskFilling", "node": NODE, "severity": "warning",
               "component": "node", "mountpoint": "/"})
    (acted,) = audit_for(env, "disk_cleanup", "acted", timeout=90)
    root = env.cleanup_root
    remaining = sorted(p.name for p in (root / "ckpt").glob("*.pt"))
    assert remaining == ["step-000200.pt", "step-000400.pt", "step-000500.pt", "step-000600.pt"]
    manifest = json.loads((root / "ckpt" / "manifest.json").read_text())
    assert [e["step"] for e in manifest["checkpoints"]] == [200, 400, 500, 600]
    assert not (root / "logs" / "old.log").exists() and (root / "logs" / "new.log").exists()
    assert not (root / "cache" / "old.bin").exists()
    assert (root / "logs" / "link-to-outside.log").is_symlink()
    assert (root.parent / "outside-victim.log").read_bytes() == b"must survive"
    captured = acted["detail"]["results"][0]["result"]["captured"]
    report = json.loads(next(iter(captured.values())))
    assert report["bytes_freed"] == 2 * 1000 + 2 * 500


def test_gpu_power_limit_lowers_then_restores_on_resolve(env: Env) -> None:
    labels = {"alertname": "GpuTemperatureHigh", "node": NODE, "gpu": "0",
              "severity": "warning", "component": "gpu"}

    def limit() -> int:
        return json.loads(env.scenario.read_text())["gpus"][0]["power_limit_mw"]

    fire(env, labels)
    audit_for(env, "gpu_power_limit", "acted", timeout=90)
    assert limit() == 255000  # 300 W - 15 %, inside the card's [100, 350] W
    fire(env, labels, resolve=True)
    audit_for(env, "gpu_power_limit", "acted", count=2, timeout=90)
    assert limit() == 300000


def test_stalled_job_diagnostics_dumps_every_rank_and_pages(env: Env) -> None:
    ready = env.workdir / "stalled-ready"
    ready.mkdir()
    argv = torchrun_argv(REPO / "tests" / "remediation" / "stalled_job.py", str(ready))
    with running(argv, env.workdir / "stalled-job.log",
                 env={**env.job_environment, "TRAINWATCH_JOB": STALLED}, cwd=REPO) as job:
        wait_until(lambda: len(list(ready.glob("rank*.ready"))) == 2, timeout=120,
                   what=f"both ranks up:\n{job.log_text()[-2000:]}")
        wait_until(lambda: requests.get(f"{env.prometheus}/api/v1/query", params={
            "query": f'training_step{{training_job="{STALLED}"}}'}, timeout=5).json()["data"][
            "result"], timeout=60, what="Prometheus to see the stalled job")
        fire(env, {"alertname": "TrainingStalled", "training_job": STALLED,
                   "severity": "critical", "component": "training"})
        (acted,) = audit_for(env, "stalled_job_diagnostics", "acted", timeout=120)
        assert job.alive()  # diagnostics never kill anything
    captured = acted["detail"]["results"][0]["result"]["captured"]
    dump = json.loads(next(iter(captured.values())))
    ranks = sorted(p["rank"] for p in dump["processes"])
    assert ranks == ["0", "1"]
    assert all("Thread" in p["dump"] for p in dump["processes"]), dump
    pages = env.pager.posts("/page")
    assert len(pages) == 1 and pages[0].body["training_job"] == STALLED
