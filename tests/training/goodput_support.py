"""The goodput tests' own stopwatch: real 2-rank torchrun jobs of jobs/goodput_worker.py, the
processes' start times from /proc, and every cause measured with the job's own clocks."""

from __future__ import annotations

import itertools
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from alert_rules import goodput as rules
from dashboards import check
from tests.dashboards.dashboard_files import load_all
from tests.support.net import free_port, wait_until
from tests.support.procs import ManagedProcess
from tests.training.support import events, of
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract import goodput as gp
from trainwatch.exporters.rank.shipper import HEARTBEAT_SECONDS

RATE_WINDOW_SECONDS = 10  # the demo profile's goodput rate window

WORKER = Path(__file__).with_name("jobs") / "goodput_worker.py"


def launch(tmp_path: Path, name: str, env: dict[str, str], args: tuple[str, ...],
           checkpoints: str = "ckpt") -> ManagedProcess:
    """A real 2-rank torchrun launch of the goodput worker (gloo, CPU)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(WORKER),
            *args, "--checkpoint-dir", str(tmp_path / checkpoints)]
    return ManagedProcess(argv, tmp_path / f"{name}.log", env=env)


def started_at(pid: int) -> float:
    """Unix time a live process started, from the kernel's own record (/proc)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def starts(job: ManagedProcess) -> dict[int, float]:
    """Each rank's process start, read while the ranks live."""
    found = wait_until(lambda: (s := of(events(job), "start")) and len(s) == 2 and s,
                       timeout=120, what="both ranks started")
    return {e["rank"]: started_at(e["pid"]) for e in found}


def newest_step(job: ManagedProcess, rank: int = 0) -> int:
    return max((e["step"] for e in of(events(job), "step", rank=rank)), default=-1)


def node_totals(exp: Any, job: str) -> dict[str, float]:
    """The job's goodput counters on the node, all from one scrape."""
    text = requests.get(exp.url + "/metrics", timeout=5).text
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get(catalog.LABEL_JOB) != job:
                continue
            if sample.name == catalog.TRAINING_NODE_TIME:
                totals[labels["kind"]] = sample.value
            elif sample.name == catalog.TRAINING_NODE_DISCARDED:
                totals[f"discarded_{labels['cause']}"] = sample.value
            elif sample.name == catalog.TRAINING_NODE_WALL:
                totals["wall"] = totals.get("wall", 0.0) + sample.value
    return totals


class Measured:
    """What the job's own clocks say, per launch and rank."""

    def __init__(self) -> None:
        self.expected = dict.fromkeys((*gp.CAUSES, "discarded_rollback", "discarded_restart",
                                       "wall"), 0.0)

    def launch(self, found: list[dict[str, Any]], start: dict[int, float],
               end: dict[int, float], resumed_step: int | None = None) -> dict[int, dict]:
        """Add one launch's measured seconds; returns each rank's productive time per step."""
        e = self.expected
        per_rank = {}
        for rank in (0, 1):
            steps = of(found, "step", rank=rank)
            saved = {s["step"]: s["seconds"] for s in of(found, "saved", rank=rank)}
            rolled = {r["step"]: r for r in of(found, "rolled_back", rank=rank)}
            resumed = of(found, "resumed", rank=rank)[0]
            first = steps[0]
            e["startup"] += (first["wall"] - start[rank] - resumed["seconds"]
                             - first["data_wait"])
            e["checkpoint_restore"] += resumed["seconds"]
            e["data_wait"] += sum(s["data_wait"] for s in steps)
            productive: list[tuple[int, float]] = []
            for previous, step in itertools.pairwise(steps):
                blocked = saved.get(previous["step"], 0.0)
                if previous["step"] in rolled and rolled[previous["step"]]["seconds"] > 0:
                    blocked += rolled[previous["step"]]["seconds"]
                productive.append((step["step"], step["perf"] - previous["perf"]
                                   - step["data_wait"] - blocked))
            e["checkpoint_save"] += sum(saved.values())
            e["checkpoint_restore"] += sum(r["seconds"] for r in rolled.values())
            e["wall"] += end[rank] - start[rank]
            per_rank[rank] = {"steps": steps, "productive": productive, "rolled": rolled}
        return per_rank


def query(url: str, expr: str) -> float | None:
    answer = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5).json()
    result = answer["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def settled_ettr(url: str, job: str, wall: float) -> float:
    """The 1 h ETTR once Prometheus has seen the job's whole wall counted (as measured, less
    what the exporter cannot see: a killed rank's life after its last heartbeat) and a rate
    window has passed over the last increase (the recorded wall rate is back at 0)."""
    blind = 2 * HEARTBEAT_SECONDS + 0.5  # two ranks
    seen = (f"sum(max_over_time({catalog.TRAINING_NODE_WALL}"
            f'{{training_job="{job}"}}[1h]))')
    try:
        wait_until(lambda: (query(url, seen) or 0.0) >= wall - blind,
                   timeout=60, what=f"{job}'s wall counted in Prometheus")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: measured wall {wall:.2f}, "
                             f"Prometheus saw {query(url, seen)}") from None
    counted = time.time()

    def ready() -> float | None:
        if time.time() < counted + RATE_WINDOW_SECONDS + 2:
            return None
        rate = query(url, f'{rules.WALL_RATE}{{training_job="{job}"}}')
        ettr = query(url, f'{rules.ETTR_1H}{{training_job="{job}"}}')
        # 0, or absent: what the code before kept no series for once the job expired
        return ettr if rate in (0.0, None) and ettr is not None else None

    return wait_until(ready, timeout=90, what=f"{job}'s 1 h ETTR settled")


def goodput_panels_sound(prom: str, job: str, start: float, end: float,
                         ranks: int) -> dict[str, int]:
    """Every Goodput dashboard query (and annotation) over [start, end] (1 s steps) for
    `job`: no NaN or infinity, no negative value in a share panel, the stacked shares of
    "Time by kind" adding up to 1 within 0.01 at every instant that has them, and "Ranks
    counted" the job's `ranks` wherever it has a value (through stalls and restarts too).
    Returns the number of points read per panel (issue 37, shape 4 and acceptance 3)."""
    dashboard = next(d for d in load_all().values() if d["uid"] == "trainwatch-goodput")
    points: dict[str, int] = {}
    for title, expr in check.panel_queries(dashboard, {"training_job": job}):
        panel = next(p for p in check.panels(dashboard) if p.get("title") == title)
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        resp = requests.get(f"{prom}/api/v1/query_range", timeout=30, params={
            "query": expr, "start": start, "end": end, "step": 1})
        assert resp.status_code == 200, (title, resp.text)
        series = resp.json()["data"]["result"]
        sums: dict[float, float] = {}
        for one in series:
            for at, value in one["values"]:
                number = float(value)
                assert math.isfinite(number), (title, one["metric"], at, value)
                if unit == "percentunit":
                    assert number >= 0.0, (title, one["metric"], at, value)
                sums[at] = sums.get(at, 0.0) + number
        if title == "Ranks counted":
            assert set(sums.values()) <= {float(ranks)}, (title, sums)
        if title == "Time by kind":
            off = {at: s for at, s in sums.items() if abs(s - 1.0) > 0.01}
            assert sums and not off, (title, off)
        points[title] = sum(len(one["values"]) for one in series)
    for name, expr in check.annotation_queries(dashboard, {"training_job": job}):
        resp = requests.get(f"{prom}/api/v1/query_range", timeout=30, params={
            "query": expr, "start": start, "end": end, "step": 1})
        assert resp.status_code == 200, (name, resp.text)
        for one in resp.json()["data"]["result"]:
            assert all(math.isfinite(float(v)) for _, v in one["values"]), (name, one)
    return points
