"""Issue 13, acceptance 2: a job killed whole raises TrainingJobVanished; a clean finish not.

Real torchrun jobs of the test worker, the real exporter and a real Prometheus with the demo
rule profile (production timing: alert_rules/tests/production/stall_test.yml).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from tests.support.net import free_port, wait_until
from tests.support.procs import prometheus, running
from tests.training.support import JOB_BASE_ENV, exporter
from tests.training.test_hang import prometheus_config
from tests.training.test_job_identity import kill_whole, worker_torchrun
from trainwatch.exporters.contract import catalog


def alerts(prom: str, job: str) -> list[dict]:
    found = requests.get(f"{prom}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return [a for a in found if a["labels"]["alertname"] == "TrainingJobVanished"
            and a["labels"].get("training_job") == job]


@pytest.mark.slow
def test_killed_job_alerts_and_finished_job_does_not(tmp_path: Path) -> None:
    with exporter(tmp_path) as exp, \
            prometheus(tmp_path, prometheus_config(tmp_path, exp.url)) as prom:
        with running(worker_torchrun("--steps", "40", nproc=2, master_port=free_port()),
                     tmp_path / "done.log", env={**JOB_BASE_ENV, **exp.job_env("done")}) as done:
            wait_until(lambda: not done.alive(), timeout=120, what="clean job finished")
            assert done.proc.returncode == 0, done.log_text()[-2000:]
        assert exp.by_rank(catalog.TRAINING_FINISHED, "done") == {"0": 1.0, "1": 1.0}
        with running(worker_torchrun("--steps", "0", nproc=2, master_port=free_port()),
                     tmp_path / "killed.log", env={**JOB_BASE_ENV, **exp.job_env("killed")}
                     ) as killed:
            wait_until(lambda: len(exp.by_rank(catalog.TRAINING_STEP, "killed")) == 2,
                       timeout=90, what="killed job reporting")
            kill_whole(killed)
        assert exp.by_rank(catalog.TRAINING_FINISHED, "killed") == {"0": 0.0, "1": 0.0}
        wait_until(lambda: [a for a in alerts(prom, "killed") if a["state"] == "firing"],
                   timeout=90, what="TrainingJobVanished for the killed job")
        assert alerts(prom, "done") == []
