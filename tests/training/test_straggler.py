"""Issue 28, point 6 and acceptance 3: a straggler in synchronous training is named.

Real parts: torchrun with 4 gloo ranks of the test worker (each step: its own work, a sleep,
then an all-reduce with every rank, so every rank's step time is the slowest rank's), the
training exporter, and a real Prometheus scraping it every second with the demo rule
profile. A rank whose own work takes 20% longer is named by TrainingStragglerRank with its
node; a job whose ranks are all equally slow fires nothing. The production timing (within 5
minutes) is promtool's: alert_rules/tests/production/straggler_test.yml. Old code compared
step times, which the all-reduce makes equal: no rank was ever named.
"""

from __future__ import annotations

import time
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
    return [a for a in found if a["labels"]["alertname"] == "TrainingStragglerRank"
            and a["labels"].get("training_job") == job]


@pytest.mark.slow
def test_a_rank_20_percent_slower_is_named_and_an_evenly_slow_job_is_not(
        tmp_path: Path) -> None:
    with exporter(tmp_path) as exp, \
            prometheus(tmp_path, prometheus_config(tmp_path, exp.url)) as prom:
        slow = worker_torchrun("--steps", "0", "--step-time", "0.1", "--slow-rank", "2",
                               "--slow-factor", "1.2", nproc=4, master_port=free_port())
        with running(slow, tmp_path / "slow.log",
                     env={**JOB_BASE_ENV, **exp.job_env("straggler")}) as job:
            try:
                started = time.time()
                fired = wait_until(lambda: [a for a in alerts(prom, "straggler")
                                            if a["state"] == "firing"], timeout=180,
                                   what="TrainingStragglerRank")
                print(f"TrainingStragglerRank (demo profile) firing {time.time() - started:.0f}"
                      " s after the job started")
                assert [(a["labels"]["rank"], a["labels"]["node"]) for a in fired] == [
                    ("2", "node-a")]
                compute = exp.by_rank(catalog.TRAINING_COMPUTE, "straggler")
                steps = exp.samples(catalog.TRAINING_STEP_DURATION + "_sum", "straggler")
                print("own compute per step:", compute, "step time sums:", steps)
                assert compute["2"] > 1.1 * max(compute[r] for r in ("0", "1", "3"))
            finally:
                kill_whole(job)
        even = worker_torchrun("--steps", "0", "--step-time", "0.12", nproc=4,
                               master_port=free_port())
        with running(even, tmp_path / "even.log",
                     env={**JOB_BASE_ENV, **exp.job_env("even")}) as job:
            try:
                wait_until(lambda: len(exp.by_rank(catalog.TRAINING_COMPUTE, "even")) == 4,
                           timeout=120, what="every rank's own compute time")
                quiet_until = time.time() + 30  # longer than the straggler took to fire
                while time.time() < quiet_until:
                    assert alerts(prom, "even") == [], exp.by_rank(catalog.TRAINING_COMPUTE,
                                                                   "even")
                    time.sleep(1)
            finally:
                kill_whole(job)
