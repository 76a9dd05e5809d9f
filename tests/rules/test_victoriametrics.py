"""The long-term store: a real Prometheus remote-writes to a real VictoriaMetrics, and every
dashboard query returns the same data from both for a small demo job.

Real parts: VictoriaMetrics (Debian victoria-metrics), Prometheus scraping the real training
exporter (two rank processes of the real training client) and the GPU exporter in its
simulation mode (no GPU here), remote_write as the prometheus role renders it. Each query of
dashboards/generated/*.json (Grafana variables set to "all", $__rate_interval to a fixed
window) runs as a range query over the same aligned window on both servers.

Where the two query languages differ by design, values are compared with a tolerance instead
of exactly (see EXTRAPOLATING): MetricsQL's rate()/increase() do not extrapolate to the
window's edges as PromQL's do.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests
import yaml

from dashboards.check import BUILTINS as GRAFANA_BUILTINS
from tests.rules.exposed_metrics import REPO, _script
from tests.support.net import free_port, wait_until
from tests.support.procs import prometheus, running

pytestmark = pytest.mark.slow

DASHBOARDS = REPO / "dashboards" / "generated"
RATE_WINDOW_SECONDS = 10  # ten scrapes at 1 s
RATE_WINDOW = f"{RATE_WINDOW_SECONDS}s"
# Grafana's own variables ($__range, ...) as dashboards/check.py sets them, the rate windows
# at this test's scrape interval
BUILTINS = {**GRAFANA_BUILTINS, "__rate_interval": RATE_WINDOW, "__interval": RATE_WINDOW}
STEP = 5
# A new job's goodput counters are served at zero this long, then jump to what they hold: a
# jump inside or just before the compared window is where the two languages differ by design
# (MetricsQL's rate takes the sample before the window as its base, PromQL's does not). Short,
# so the window can begin a full rate window after it; at least one scrape interval.
ZERO_HOLD_SECONDS = 2
# functions whose MetricsQL result differs from PromQL's by design (no extrapolation to the
# window's edges, see docs.victoriametrics.com/MetricsQL: rate, increase)
EXTRAPOLATING = re.compile(r"\b(rate|increase|irate|delta|deriv|histogram_quantile)\(")
RANK_SCRIPT = """
import math, sys, time
from trainwatch.exporters.rank.client import TrainingMonitor
monitor = TrainingMonitor(control=False)
began, step = time.monotonic(), 0
while time.monotonic() - began < float(sys.argv[1]):
    time.sleep(0.05)
    monitor.report(step, loss=2.0 * math.exp(-step / 500), lr=1e-3, grad_norm=0.5, samples=8,
                   tokens=8192)
    monitor.step_end(step)
    step += 1
monitor.close()
"""


def dashboard_queries() -> dict[str, str]:
    """'dashboard: panel expr' -> the expr with every Grafana variable set to match all."""
    out: dict[str, str] = {}

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            expr = node.get("expr")
            if isinstance(expr, str) and expr:
                out[f"{where}: {expr}"] = re.sub(r"\$(__\w+)", lambda m: BUILTINS[m[1]], expr)
            for value in node.values():
                walk(value, where)
        elif isinstance(node, list):
            for value in node:
                walk(value, where)

    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        before = set(out)
        walk(dashboard, path.stem)
        # a custom variable (how many ranks a top-k panel shows) takes its current value
        custom = {v["name"]: str(v.get("current", {}).get("value", ""))
                  for v in dashboard.get("templating", {}).get("list", [])
                  if v.get("type") == "custom"}
        for key in set(out) - before:
            for name, value in custom.items():
                out[key] = re.sub(rf"\$\{{?{name}\b\}}?", value, out[key])
    # every remaining $var is a label matcher `label=~"$var"`: match anything
    return {k: re.sub(r'=~"\$[a-z_]+"', '=~".*"', v) for k, v in out.items()}


def _range(url: str, expr: str, start: int, end: int) -> dict[str, dict[float, float]]:
    body = requests.post(f"{url}/api/v1/query_range", data={
        "query": expr, "start": start, "end": end, "step": STEP}, timeout=30).json()
    assert body["status"] == "success", f"{url}: {body}\n{expr}"
    return {json.dumps({k: v for k, v in s["metric"].items() if k != "__name__"},
                       sort_keys=True):
            {float(t): float(v) for t, v in s["values"]} for s in body["data"]["result"]}


def _raw(url: str, seconds: int, at: int) -> dict[str, list[int]]:
    """Each series of the demo (its labels) -> the millisecond timestamps of its raw samples in
    the `seconds` before `at`, as one store holds them."""
    body = requests.post(f"{url}/api/v1/query", data={
        "query": f'{{job=~"gpu|training"}}[{seconds}s]', "time": at}, timeout=30).json()
    assert body["status"] == "success", f"{url}: {body}"
    # the selector's left edge is inclusive in one store and not the other: leave it a second
    after = (at - seconds + 1) * 1000
    return {json.dumps(s["metric"], sort_keys=True):
            [ms for ms in (round(float(t) * 1000) for t, _ in s["values"]) if ms > after]
            for s in body["data"]["result"]}


def _close(a: float, b: float, rel: float) -> bool:
    if a == b or (a != a and b != b):  # equal, or both NaN
        return True
    # VictoriaMetrics compresses float values (a Unix-timestamp gauge such as
    # training_last_step_timestamp_seconds comes back off by about a microsecond)
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), 1e-5)


def test_dashboard_queries_return_the_same_data_from_victoriametrics(
        real_binaries: dict[str, str], tmp_path: Path) -> None:
    vm_port, prom_port = free_port(), free_port()
    gpu_port, train_port = free_port(), free_port()
    token = tmp_path / "control.token"
    token.write_text("x" * 32)
    token.chmod(0o600)
    vm = f"http://127.0.0.1:{vm_port}"
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "gpu", "static_configs": [{"targets": [f"127.0.0.1:{gpu_port}"],
                                                    "labels": {"node": "n1"}}]},
            {"job_name": "training", "static_configs": [
                {"targets": [f"127.0.0.1:{train_port}"], "labels": {"node": "n1"}}]},
            {"job_name": "prometheus", "static_configs": [
                {"targets": [f"127.0.0.1:{prom_port}"]}]},
        ],
        "remote_write": [{"url": f"{vm}/api/v1/write",
                          "queue_config": {"batch_send_deadline": "1s"}}],
    }))
    with ExitStack() as stack:
        stack.enter_context(running(
            ["victoria-metrics", f"-httpListenAddr=127.0.0.1:{vm_port}",
             f"-storageDataPath={tmp_path / 'vm-data'}", "-retentionPeriod=1",
             "-search.latencyOffset=0s", "-search.disableCache"],
            tmp_path / "vm.log", ready_url=f"{vm}/health"))
        stack.enter_context(running(
            [_script("gpu-exporter"), "--bind", "127.0.0.1", "--port", str(gpu_port),
             "--interval", "1", "--simulate", "2"],
            tmp_path / "gpu.log", ready_url=f"http://127.0.0.1:{gpu_port}/metrics"))
        stack.enter_context(running(
            [_script("training-exporter"), "--bind", "127.0.0.1", "--port", str(train_port),
             "--socket", str(tmp_path / "training.sock"), "--token-file", str(token),
             "--node", "n1", "--goodput-zero-seconds", str(ZERO_HOLD_SECONDS)],
            tmp_path / "training.log", ready_url=f"http://127.0.0.1:{train_port}/metrics"))
        prom = stack.enter_context(prometheus(tmp_path, config, port=prom_port))
        ranks = [subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, "90"], cwd=REPO, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                 "TRAINWATCH_JOB": "vmdemo",
                 "TRAINWATCH_EXPORTER_SOCKET": str(tmp_path / "training.sock")})
            for r in range(2)]
        stack.callback(lambda: [r.kill() or r.wait(10) for r in ranks])
        began = int(time.time())

        def first_in_vm(metric: str) -> float | None:
            """When the newest-born series of `metric` has its first sample in VictoriaMetrics
            (remote_write may deliver the first seconds late under load, or not at all while
            VictoriaMetrics starts; the job's series are born when its ranks first report,
            after their start-up, which a loaded machine stretches)."""
            got = _range(vm, metric, began - 60, int(time.time()))
            return max((min(points) for points in got.values() if points), default=None)
        firsts = {metric: wait_until(lambda metric=metric: first_in_vm(metric), timeout=120,
                                     interval=1, what=f"the first {metric} in VictoriaMetrics")
                  for metric in ("trainwatch_gpu_up", "training_node_time_seconds_total")}
        # 20 s of the running job, aligned to the step, starting once every counter has a full
        # rate window and the sample before it behind its first sample and its jump from zero
        # in both stores (MetricsQL counts a counter's first sample from zero and takes the
        # sample before the window as a base, PromQL does neither: such windows differ by design)
        settled = int(max(firsts.values())) + ZERO_HOLD_SECONDS + RATE_WINDOW_SECONDS
        start = (max(began, settled) + 5) // STEP * STEP + STEP
        end = start + 20
        wait_until(lambda: time.time() > end + 3, timeout=120, interval=0.5,
                   what="the demo job's window to pass")

        def vm_caught_up() -> bool:
            # the newest sample Prometheus holds for the job at `end` has reached VictoriaMetrics
            q = {"query": 'count(training_step{training_job="vmdemo"})', "time": end}
            ours = requests.get(f"{prom}/api/v1/query", params=q, timeout=5).json()
            theirs = requests.get(f"{vm}/api/v1/query", params=q, timeout=5).json()
            return (ours["data"]["result"] == theirs["data"]["result"]
                    and bool(ours["data"]["result"]))
        wait_until(vm_caught_up, timeout=60, interval=1, what="remote_write to VictoriaMetrics")
        # samples of the window, and of the rate window before it, may still be in flight (a
        # range query hides a missing raw sample behind the one before it; a rate over that
        # gap reaches back to when start-up was still counted): wait for every raw sample
        lookback = end - start + RATE_WINDOW_SECONDS + 2 * STEP
        wait_until(lambda: _raw(vm, lookback, end) == _raw(prom, lookback, end),
                   timeout=60, interval=1,
                   what="VictoriaMetrics to hold every raw sample of the window")

        queries = dashboard_queries()
        assert len(queries) >= 40
        compared, with_data, mismatches = 0, 0, []
        for name, expr in queries.items():
            ours, theirs = _range(prom, expr, start, end), _range(vm, expr, start, end)
            compared += 1
            with_data += bool(ours)
            rel = 0.35 if EXTRAPOLATING.search(expr) else 1e-6
            if set(ours) != set(theirs):
                mismatches.append(f"{name}: series {sorted(ours)} vs {sorted(theirs)}")
                continue
            for labels, points in ours.items():
                # MetricsQL may fill a point Prometheus leaves empty at a series' edge
                for t, value in points.items():
                    other = theirs[labels].get(t)
                    if other is None or not _close(value, other, rel):
                        mismatches.append(f"{name} {labels} @{t}: {value} vs {other}")
                        break
        print(f"{compared} dashboard queries compared, {with_data} with data for the demo job")
        assert not mismatches, "\n".join(mismatches[:20])
        # the demo job's own panels had data: this is not a comparison of two empty answers
        assert with_data >= 20
