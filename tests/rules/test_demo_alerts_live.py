"""The demo rule profile on live data: a real loss spike raises TrainingLossSpike in seconds.

Real training exporter, Prometheus (demo profile, scrape and evaluation every 1 s) and the real
training client in two rank processes (plain processes, not torchrun: the lead's end-to-end
test runs the torchrun demo job). Rank 0's loss jumps after a quiet period long enough for a
baseline; the alert must not fire before the jump and must fire, carrying training_job, rank
and instance, a few seconds after it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests.rules.exposed_metrics import REPO, exporters_running, prometheus_base
from tests.support.net import wait_until

SPIKE_AFTER_S = 18.0  # demo baseline: 20 s window offset 3 s, at least 10 samples
RANK_SCRIPT = """
import math, os, sys, time
from trainwatch.exporters.rank.client import TrainingMonitor
monitor = TrainingMonitor(control=False)
spike_after, stop_after = float(sys.argv[1]), float(sys.argv[2])
began = time.monotonic()
step = 0
while time.monotonic() - began < stop_after:
    time.sleep(0.05)
    loss = 2.0 * math.exp(-step / 2000)
    if os.environ["RANK"] == "0" and time.monotonic() - began > spike_after:
        loss = 9.0
    monitor.report(step, loss=loss, lr=1e-3, grad_norm=0.5, samples=8)
    monitor.step_end(step)
    step += 1
monitor.close()
"""


def _loss_spike_alerts(prom: str) -> list[dict]:
    alerts = requests.get(f"{prom}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == "TrainingLossSpike"]


def test_loss_spike_fires_within_seconds_and_not_at_job_start(real_binaries: dict[str, str],
                                                              tmp_path: Path) -> None:
    with exporters_running(tmp_path / "stack") as urls:
        prom = prometheus_base(urls)
        training_instance = urls["training"].removeprefix("http://").removesuffix("/metrics")
        started = time.monotonic()
        ranks = [subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(SPIKE_AFTER_S), "60"], cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                 "TRAINWATCH_JOB": "live", "TRAINWATCH_EXPORTER_SOCKET":
                     str(tmp_path / "stack" / "training.sock")}) for rank in range(2)]
        try:
            # before the spike: the job starts, its baseline fills, nothing fires
            def quiet_until_spike() -> bool:
                assert not _loss_spike_alerts(prom), "fired before any spike (job start)"
                return time.monotonic() - started > SPIKE_AFTER_S
            wait_until(quiet_until_spike, timeout=SPIKE_AFTER_S + 5, interval=0.5,
                       what="the pre-spike period")
            spiked = time.monotonic()

            def firing() -> dict | None:
                return next((a for a in _loss_spike_alerts(prom) if a["state"] == "firing"),
                            None)
            alert = wait_until(firing, timeout=20, interval=0.25, what="TrainingLossSpike")
            print(f"TrainingLossSpike firing {time.monotonic() - spiked:.1f} s after the spike")
            assert alert["labels"]["training_job"] == "live"
            assert alert["labels"]["rank"] == "0"
            assert alert["labels"]["instance"] == training_instance
            assert {a["labels"]["rank"] for a in _loss_spike_alerts(prom)} == {"0"}
        finally:
            for rank in ranks:
                rank.terminate()
                rank.wait(10)
