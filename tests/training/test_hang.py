"""Issue 13, acceptance 1: a 4-rank gloo job where one rank blocks forever before a collective.

Real parts throughout: torchrun with 4 ranks of the test worker, the training exporter, a real
Prometheus scraping it every second with the demo rule profile, and the diagnostics tool that
the stalled_job_diagnostics playbook runs on each node (py-spy and the ranks' flight-recorder
dumps). The alert must name rank 2, and so must the diagnostics. The production profile's
timing is covered by promtool (alert_rules/tests/production/stall_test.yml).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support.net import free_port, wait_until
from tests.support.procs import prometheus, running
from tests.training.support import JOB_BASE_ENV, events, exporter, of
from tests.training.test_job_identity import worker_torchrun
from trainwatch.exporters.contract import catalog

REPO = Path(__file__).resolve().parents[2]
JOB = "hang-job"
BLOCKED = 2


def prometheus_config(workdir: Path, exporter_url: str) -> Path:
    path = workdir / "prometheus.yml"
    target = exporter_url.removeprefix("http://")
    rules = REPO / "alert_rules" / "generated" / "demo" / "training.yml"
    path.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "training", "static_configs": [{"targets": [target]}]}],
    }))
    return path


def firing(prom: str) -> list[dict]:
    alerts = requests.get(f"{prom}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == "TrainingStalled"
            and a["state"] == "firing" and a["labels"].get("training_job") == JOB]


@pytest.mark.slow
def test_blocked_rank_is_named_by_the_alert_and_the_diagnostics(tmp_path: Path) -> None:
    diagnostics = tmp_path / "diagnostics"
    with exporter(tmp_path) as exp, \
            prometheus(tmp_path, prometheus_config(tmp_path, exp.url)) as prom:
        env = {**JOB_BASE_ENV, **exp.job_env(JOB), "TORCH_FR_BUFFER_SIZE": "200",
               catalog.ENV_DIAGNOSTICS_DIR: str(diagnostics)}
        argv = worker_torchrun("--steps", "0", "--step-time", "0.05", "--hang-rank",
                               str(BLOCKED), "--hang-at-step", "30", nproc=4,
                               master_port=free_port())
        with running(argv, tmp_path / "job.log", env=env) as job:
            hung = wait_until(lambda: of(events(job), "hanging"), timeout=120,
                              what="rank 2 blocking")[0]
            alerts = wait_until(lambda: firing(prom), timeout=90, what="TrainingStalled firing")
            latency = time.time() - hung["time"]
            print(f"TrainingStalled (demo profile) firing {latency:.1f} s after the last step")
            assert {a["labels"]["rank"] for a in alerts} == {str(BLOCKED)}

            in_collective = exp.by_rank(catalog.TRAINING_IN_COLLECTIVE, JOB)
            assert in_collective == {"0": 1.0, "1": 1.0, "2": 0.0, "3": 1.0}

            wait_until(lambda: len(list((diagnostics / JOB).glob("rank*.json"))) == 4,
                       timeout=60, what="flight recorder dumps of all 4 ranks")
            out = subprocess.run([sys.executable, "-m",
                                  "trainwatch.exporters.node.tools.stack_dump",
                                  "--job", JOB], capture_output=True, text=True, timeout=180,
                                 check=False, cwd=REPO)
            assert out.returncode == 0, out.stderr
            report = json.loads(out.stdout)
            assert job.alive(), "diagnostics never kill anything"
    assert report["collectives"]["not_entered"] == [str(BLOCKED)]
    assert report["collectives"]["entered"] == ["0", "1", "3"]
    processes = report["processes"]
    assert [p["rank"] for p in processes] == ["0", "1", "2", "3"]
    assert all("Thread" in p["dump"] for p in processes), processes
    blocked = processes[BLOCKED]
    assert "worker.py" in blocked["dump"] and blocked["flight_recorder"]["in_flight"] == []
    waiting = processes[0]["flight_recorder"]["in_flight"]
    assert waiting and waiting[0]["op"] == "gloo:all_reduce"
