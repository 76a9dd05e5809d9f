"""Every dashboard panel returns data from a running stack with a job reporting.

Real exporters, Prometheus (demo rule profile, 1 s scrape and evaluation), Alertmanager and
remediation service; two ranks report through the real training client into the real
training exporter. The ranks are plain processes, not torchrun: this test is about the
dashboards' queries, the lead's end-to-end test runs the real torchrun demo job. Panels in
dashboards.check.FAILURE_ONLY are exempt (they only have data during a failure).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import requests

from dashboards import check
from tests.dashboards.dashboard_files import load_all
from tests.rules.exposed_metrics import REPO, exporters_running, prometheus_base
from tests.support.net import wait_until

RANK_SCRIPT = """
import math, sys, time
from trainwatch.exporters.rank.client import TrainingMonitor
from trainwatch.exporters.rank.flops import ModelFlops
monitor = TrainingMonitor(control=False)
monitor.set_model_flops(ModelFlops(per_token=6e6), peak_flops=1e12)  # MFU panels
deadline = time.monotonic() + float(sys.argv[1])
step = 0
while time.monotonic() < deadline:
    time.sleep(0.05)
    monitor.report(step, loss=2.0 * math.exp(-step / 500), lr=1e-3, grad_norm=0.5,
                   samples=8, tokens=1024, data_wait=0.001)
    monitor.step_end(step)
    step += 1
monitor.close()
"""


# Exempt on the CPU demo (no peak FLOP/s there), but the ranks here report a peak: checked.
REPORTED_HERE = {("trainwatch-training-job", "MFU")}


def _empty_panels(prom: str) -> list[str]:
    empty = []
    for dashboard in load_all().values():
        counts: dict[str, int] = {}
        for title, expr in check.panel_queries(dashboard):
            body = requests.post(f"{prom}/api/v1/query", data={"query": expr}, timeout=10).json()
            counts[title] = counts.get(title, 0) + len(body["data"]["result"])
        empty += [f"{dashboard['uid']} / {title}" for title, count in counts.items()
                  if count == 0 and ((dashboard["uid"], title) not in check.FAILURE_ONLY
                                     or (dashboard["uid"], title) in REPORTED_HERE)]
    return empty


def test_every_panel_has_data_while_a_job_reports(real_binaries: dict[str, str],
                                                  tmp_path: Path) -> None:
    with exporters_running(tmp_path / "stack") as urls:
        prom = prometheus_base(urls)
        ranks = [subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, "120"], cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                 "TRAINWATCH_JOB": "panels", "TRAINWATCH_EXPORTER_SOCKET":
                     str(tmp_path / "stack" / "training.sock")}) for rank in range(2)]
        try:
            last: list[str] = []

            def all_have_data() -> bool:
                nonlocal last
                last = _empty_panels(prom)
                return not last

            try:
                wait_until(all_have_data, timeout=60, interval=1.0,
                           what="every panel to return data")
            except TimeoutError:
                raise AssertionError(f"panels without data: {json.dumps(last, indent=1)}") \
                    from None
        finally:
            for rank in ranks:
                rank.terminate()
                rank.wait(10)
