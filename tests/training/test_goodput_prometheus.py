"""What people read equals the stopwatch: the 1 h ETTR that a real Prometheus records from a
real training exporter, for real 2-rank torchrun jobs (gloo, CPU), within 0.01 of the ETTR the
test measured with the jobs' own clocks.

One exporter and one Prometheus (the demo rules: 1 s scrapes and evaluations, 10 s rate
window) serve the module; each shape is its own job:

* a healthy job's first incarnation, whose first datagram already holds its startup (the
  monitor's default flush interval): rate() must count that startup;
* a job killed, away longer than the exporter's job expiry, then relaunched from scratch: the
  job's series must last through the gap and the downtime must count;
* a job that hangs and is then killed for good, never relaunched: the hang must count, once.

And TrainingGoodputLow (demo: ETTR over 30 s under 0.9) fires for a job whose measured ETTR
over its window is under the target (a slow loader), and never for one running beside it
whose measured ETTR is above it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.net import wait_until
from tests.support.procs import ManagedProcess, prometheus
from tests.training.goodput_support import (
    Measured,
    goodput_panels_sound,
    launch,
    newest_step,
    query,
    settled_ettr,
    started_at,
    starts,
)
from tests.training.support import JOB_BASE_ENV, Exporter, events, exporter, of
from trainwatch.exporters.contract import goodput as gp

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alert_rules" / "generated" / "demo" / "goodput.yml"
EXPIRY_SECONDS = 5  # the exporter's job expiry; the relaunch gap is longer
DEPARTED_SECONDS = 3  # silent this long: the incarnation ended for good
HEALTHY = ("--steps", "120", "--step-time", "0.05", "--slow-data-steps", "20-29",
           "--data-delay", "0.1")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Exporter, str]]:
    """One training exporter (durable ledger, short expiry) and one Prometheus scraping it
    with the generated demo goodput rules."""
    workdir = tmp_path_factory.mktemp("goodput-prometheus")
    extra = ("--goodput-state", str(workdir / "goodput.db"),
             "--job-expiry-seconds", str(EXPIRY_SECONDS),
             "--rank-departed-seconds", str(DEPARTED_SECONDS),
             "--goodput-zero-seconds", "3")
    with exporter(workdir, extra=extra) as exp:
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "training", "static_configs": [
                {"targets": [exp.url.removeprefix("http://")]}]}]}))
        with prometheus(workdir, config) as url:
            yield exp, url


def truth(e: dict[str, float]) -> float:
    """Goodput over wall, from what the test measured."""
    productive = e["wall"] - sum(e[c] for c in gp.CAUSES)
    return (productive - e["discarded_rollback"] - e["discarded_restart"]) / e["wall"]


def kill_job(job: ManagedProcess) -> float:
    """SIGKILL the ranks at once, then the agent (it restarts nothing); the kill's time."""
    pids = [s["pid"] for s in of(events(job), "start")]
    killed_at = time.time()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    job.kill9()
    return killed_at


def finish(job: ManagedProcess) -> list[dict[str, Any]]:
    wait_until(lambda: not job.alive(), timeout=120, what="the job's end")
    assert job.proc.returncode == 0, job.log_text()[-3000:]
    return events(job)


def unattributed(found: list[dict[str, Any]]) -> float:
    """A clean end: from each rank's last step to the monitor's close."""
    closed = {c["rank"]: c["wall"] for c in of(found, "closed")}
    return sum(closed[r] - of(found, "step", rank=r)[-1]["wall"] for r in (0, 1))


def test_first_incarnation_startup_reaches_the_hour_ettr(
        stack: tuple[Exporter, str], tmp_path: Path) -> None:
    exp, url = stack
    job_name = "gp-healthy"
    job = launch(tmp_path, "healthy", {**JOB_BASE_ENV, **exp.job_env(job_name)},
                 (*HEALTHY, "--flush-interval", "0"))
    try:
        start = starts(job)
        found = finish(job)
    finally:
        job.stop()
    measured = Measured()
    closed = {c["rank"]: c["wall"] for c in of(found, "closed")}
    measured.launch(found, start, closed)
    e = measured.expected
    e["unattributed"] = unattributed(found)
    want = truth(e)
    got = settled_ettr(url, job_name, e["wall"])
    print(f"1 h ETTR {got:.4f}, measured {want:.4f}")
    assert e["startup"] > 2.0  # the shape: a startup worth counting
    assert abs(got - want) <= 0.01, (got, want)


def test_a_gap_longer_than_the_job_expiry_keeps_the_series_and_counts_the_downtime(
        stack: tuple[Exporter, str], tmp_path: Path) -> None:
    exp, url = stack
    job_name = "gp-gap"
    env = {**JOB_BASE_ENV, **exp.job_env(job_name)}
    first = launch(tmp_path, "first", env, HEALTHY)
    try:
        start1 = starts(first)
        wait_until(lambda: min(newest_step(first, 0), newest_step(first, 1)) >= 60,
                   timeout=60, what="step 60")
        killed_at = kill_job(first)
        found1 = events(first)
    finally:
        first.stop()
    # away longer than the exporter keeps the job's live series
    wait_until(lambda: time.time() > killed_at + EXPIRY_SECONDS + 3, timeout=30,
               what="the gap")
    second = launch(tmp_path, "second", env, HEALTHY, checkpoints="ckpt-2")  # from scratch
    try:
        start2 = starts(second)
        found2 = finish(second)
    finally:
        second.stop()
    measured = Measured()
    e = measured.expected
    one = measured.launch(found1, start1, dict.fromkeys((0, 1), killed_at))
    closed = {c["rank"]: c["wall"] for c in of(found2, "closed")}
    measured.launch(found2, start2, closed)
    e["downtime"] = sum(start2[r] - killed_at for r in (0, 1))
    e["wall"] += e["downtime"]
    last1 = {r: of(found1, "step", rank=r)[-1]["wall"] for r in (0, 1)}
    e["stall"] += sum(killed_at - last1[r] for r in (0, 1))
    e["unattributed"] = unattributed(found2)
    # no checkpoint: the relaunch threw away everything the first launch kept
    e["discarded_restart"] = sum(s for r in (0, 1) for _, s in one[r]["productive"])
    want = truth(e)
    got = settled_ettr(url, job_name, e["wall"])
    print(f"1 h ETTR {got:.4f}, measured {want:.4f} (downtime {e['downtime']:.1f} s)")
    assert abs(got - want) <= 0.01, (got, want)
    # shape 4: the dashboard through the kill, the gap and the relaunch
    goodput_panels_sound(url, job_name, min(start1.values()), time.time(), ranks=2)


def test_a_hang_then_a_kill_never_relaunched_counts_the_hang(
        stack: tuple[Exporter, str], tmp_path: Path) -> None:
    exp, url = stack
    job_name = "gp-hang"
    job = launch(tmp_path, "hang", {**JOB_BASE_ENV, **exp.job_env(job_name)},
                 (*HEALTHY, "--stall-rank", "1", "--stall-at-step", "60",
                  "--stall-seconds", "600"))
    try:
        start = starts(job)
        wait_until(lambda: min(newest_step(job, 0), newest_step(job, 1)) >= 59,
                   timeout=60, what="step 59, the last before the hang")
        hung_from = time.time()
        # the hang: both ranks alive (heartbeats go on), no step for 8 s
        wait_until(lambda: time.time() > hung_from + 8, timeout=30, what="the hang")
        killed_at = kill_job(job)
        found = events(job)
    finally:
        job.stop()
    measured = Measured()
    e = measured.expected
    measured.launch(found, start, dict.fromkeys((0, 1), killed_at))
    e["stall"] = sum(killed_at - of(found, "step", rank=r)[-1]["wall"] for r in (0, 1))
    want = truth(e)
    got = settled_ettr(url, job_name, e["wall"])
    print(f"1 h ETTR {got:.4f}, measured {want:.4f} (stall {e['stall']:.1f} s)")
    assert e["stall"] > 15.0
    assert abs(got - want) <= 0.01, (got, want)
    # shape 4: the dashboard through the hang and the kill
    goodput_panels_sound(url, job_name, min(start.values()), time.time(), ranks=2)


def window_truth(found: list[dict[str, Any]], since: float) -> float:
    """ETTR of the steps reported after `since` (Unix time), from the job's own clocks:
    each interval between two reports less the data wait the loop measured in it."""
    total = kept = 0.0
    for rank in (0, 1):
        steps = [s for s in of(found, "step", rank=rank) if s["wall"] >= since]
        for previous, step in itertools.pairwise(steps):
            interval = step["perf"] - previous["perf"]
            total += interval
            kept += interval - step["data_wait"]
    return kept / total


def test_the_alert_fires_for_the_job_below_target_and_only_for_it(
        stack: tuple[Exporter, str], tmp_path: Path) -> None:
    exp, url = stack
    endless = ("--steps", "1000000", "--step-time", "0.05")
    slow = launch(tmp_path, "slow", {**JOB_BASE_ENV, **exp.job_env("gp-slow")},
                  (*endless, "--slow-data-steps", "0-1000000", "--data-delay", "0.1"),
                  checkpoints="ckpt-slow")
    fast = launch(tmp_path, "fast", {**JOB_BASE_ENV, **exp.job_env("gp-fast")}, endless,
                  checkpoints="ckpt-fast")
    began = time.time()
    firing = 'ALERTS{alertname="TrainingGoodputLow",alertstate="firing",training_job="%s"}'
    try:
        wait_until(lambda: query(url, firing % "gp-slow") == 1.0, timeout=180,
                   what="TrainingGoodputLow firing for the slow job")
        fired = time.time()
        slow_found, fast_found = events(slow), events(fast)
        never = query(url, f'max_over_time(ALERTS{{alertname="TrainingGoodputLow",'
                           f'training_job="gp-fast"}}[{int(time.time() - began) + 5}s])')
    finally:
        slow.stop()
        fast.stop()
    # the alert's window (30 s) before it fired: the slow job's truth was below the target,
    # the fast job's above it all along
    assert window_truth(slow_found, fired - 30) < 0.9
    assert window_truth(fast_found, began) > 0.9
    assert never is None  # neither pending nor firing, ever


FRAMEWORK_WORKER = Path(__file__).with_name("jobs") / "framework_worker.py"


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_a_framework_jobs_loader_time_is_not_productive_in_the_hour_ettr(
        stack: tuple[Exporter, str], tmp_path: Path, framework: str) -> None:
    """Shape 3: a real Trainer (Hugging Face, Lightning) with a slow loader, through the
    installed callback. Its own clocks: the process start (/proc), the loader's seconds, each
    optimizer step's end and the trainer's return; the loader's time is data wait, not
    productive (the code before counted it productive: ETTR far above the truth)."""
    pytest.importorskip("transformers" if framework == "hf" else "lightning")
    exp, url = stack
    job_name = f"gp-{framework}"
    job = ManagedProcess([sys.executable, str(FRAMEWORK_WORKER), framework],
                         tmp_path / f"{framework}.log",
                         env={**JOB_BASE_ENV, **exp.job_env(job_name),
                              "TMPDIR": str(tmp_path)})
    try:
        pid = wait_until(lambda: of(events(job), "start"), timeout=60, what="the job's start")
        began = started_at(pid[0]["pid"])
        wait_until(lambda: not job.alive(), timeout=300, what="the trainer's end")
        assert job.proc.returncode == 0, job.log_text()[-3000:]
        found = events(job)
    finally:
        job.stop()
    steps = of(found, "step")
    closed = of(found, "closed")[0]["wall"]
    first, last = steps[0], steps[-1]
    wall = closed - began
    loader = last["loader"]
    startup = first["wall"] - began - first["loader"]
    productive = wall - startup - loader - (closed - last["wall"])
    want = productive / wall
    got = settled_ettr(url, job_name, wall)
    print(f"{framework}: 1 h ETTR {got:.4f}, measured {want:.4f} (loader {loader:.2f} s of "
          f"{wall:.2f} s)")
    assert loader > 0.2 * wall  # the shape: a loader worth counting
    assert abs(got - want) <= 0.01, (got, want)
