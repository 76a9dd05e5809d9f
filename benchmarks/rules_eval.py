"""Benchmark how the cost of evaluating Trainwatch's production rules grows with the fleet.

    .venv/bin/python benchmarks/rules_eval.py [--gpus 1024,4096,8192] [--cache-dir DIR]

For each fleet size (GPUs = ranks: nodes x 8 GPUs, one training job with one rank per GPU) a
real Prometheus receives a synthetic history through its remote-write receiver
(benchmarks/synthetic_fleet.py: one sample per series every --step seconds, from
--history-minutes ago to --future-minutes ahead, so every window the rules read is full while
Prometheus evaluates them at wall-clock time). The samples sit in the head block, where a
production Prometheus keeps the last hours it scraped. Then the production rule files are
loaded (config reload) and Prometheus's own rule manager evaluates them, every group at its
production interval (the global 15 s, or the group's own `interval`).

What is counted, per variant, over --measure-seconds (a whole number of the longest group
interval, after every group has evaluated once with cold caches):

- **rule CPU per second**: Prometheus's process CPU time (user + system, /proc) during the
  window, minus its idle CPU with the same data and no rules, divided by the window. This is
  the production figure: the share of one core that rule evaluation takes from scraping,
  ingestion and queries, whatever the groups' intervals. A group evaluated every 60 s costs a
  quarter of one evaluated every 15 s. The budget, 10 % of the 15 s evaluation interval, is
  the same quantity for rules that all run every 15 s (1.5 s of CPU per 15 s = 0.1 core).
  CPU time is also what a loaded machine distorts least: time spent waiting for a core is
  not counted.
- **evaluation time per second**: the sum over groups of the median `evaluationTime`
  (/api/v1/rules, wall time) divided by the group's interval; and the largest
  evaluationTime / interval of any group, which must stay well below 1 (a group slower than
  its interval skips rounds).

Baseline in the same run, on the same data: the same rules generated with
`aggregate_per_job_and_node: false` (alerts read every rank and GPU series themselves, and
every group runs at the global interval). Ratios printed: with / without, and each size / the
smallest (linear growth = the GPU ratio).

--cache-dir keeps each size's Prometheus data directory: a later run reuses it (Prometheus
replays its WAL into the head at start) while its future samples last, i.e. for about
--future-minutes after it was written, minus the run time; older caches are rebuilt.

Prints one line per result and, last, a JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from alert_rules import generate  # noqa: E402
from alert_rules.config import CONFIG_PATH, load_raw, resolve, seconds  # noqa: E402
from benchmarks import synthetic_fleet  # noqa: E402
from tests.support.net import free_port, wait_until  # noqa: E402
from tests.support.procs import ManagedProcess, running  # noqa: E402

PRODUCTION_INTERVAL = 15.0  # seconds: the prometheus role's prometheus_evaluation_interval
BUDGET_CORES = 0.10  # 10 % of the interval = 0.1 s of CPU per second
# the fleet's shape and values: a cache written by another version of them is rebuilt
FLEET_VERSION = hashlib.sha256(Path(synthetic_fleet.__file__).read_bytes()).hexdigest()[:12]


def rule_files(aggregate: bool, out: Path) -> list[Path]:
    """The production rule files, with or without the per-job / per-node aggregation."""
    raw = load_raw(CONFIG_PATH)
    raw["defaults"]["aggregate_per_job_and_node"] = aggregate
    rendered = generate.render(resolve(raw, "production"))
    (out / "production").mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (out / "production" / name).write_text(text)
    return [out / "production" / name for name in rendered]


def group_intervals(files: list[Path]) -> dict[str, float]:
    """Group name -> evaluation interval (s) under a 15 s global interval."""
    out = {}
    for f in files:
        for g in yaml.safe_load(f.read_text())["groups"]:
            out[g["name"]] = seconds(g.get("interval", f"{int(PRODUCTION_INTERVAL)}s"))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _write_config(path: Path, files: list[Path]) -> None:
    path.write_text(yaml.safe_dump({
        "global": {"evaluation_interval": f"{int(PRODUCTION_INTERVAL)}s"},
        "rule_files": [str(f) for f in files],
    }))


@contextmanager
def prometheus(work: Path, data: Path) -> Iterator[tuple[str, ManagedProcess]]:
    """A real Prometheus on `data` with no rules yet; yields (url, process)."""
    config = work / "prometheus.yml"
    _write_config(config, [])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d",
            "--web.enable-remote-write-receiver", "--web.enable-lifecycle", "--log.level=warn"]
    # replaying a large fleet's WAL takes longer than a test's 30 s
    with running(argv, work / f"prometheus-{port}.log", ready_url=f"{url}/-/ready",
                 timeout=900) as proc:
        yield url, proc


def load_rules(url: str, config: Path, files: list[Path]) -> None:
    _write_config(config, files)
    response = requests.post(f"{url}/-/reload", timeout=120)
    response.raise_for_status()


def idle_cpu(proc: ManagedProcess, seconds: float) -> float:
    """Prometheus's CPU per second with its data and no rules (head housekeeping)."""
    before, began = cpu_seconds(proc.pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(proc.pid) - before) / (time.monotonic() - began)


def _rules(url: str) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = requests.get(f"{url}/api/v1/rules", timeout=60).json()[
        "data"]["groups"]
    return groups


def measure(url: str, proc: ManagedProcess, files: list[Path], idle: float,
            seconds: float) -> dict[str, Any]:
    """Evaluate `files` in the running Prometheus (already loaded): CPU and evaluation times
    over `seconds` (a multiple of every group's interval) after every group's first (cold)
    evaluation. Groups evaluated less often than every `seconds` cannot be measured; a group
    whose interval is `seconds` itself is measured once, warm: the window starts after its
    first evaluation (waiting for a second one would double the warm-up)."""
    intervals = group_intervals(files)
    names = set(intervals)
    first: dict[str, str] = {}
    if any(seconds % interval for interval in intervals.values()):
        raise ValueError(f"the window, {seconds} s, is not a multiple of {intervals}")

    def warmed() -> bool:
        now = {g["name"]: g["lastEvaluation"] for g in _rules(url)
               if g["name"] in names and not g["lastEvaluation"].startswith("0001-")}
        for name, at in now.items():
            first.setdefault(name, at)
        return all(name in now and (now[name] != first[name] or intervals[name] >= seconds)
                   for name in names)

    wait_until(warmed, timeout=max(intervals.values()) * 2 + 300, interval=1.0,
               what="every rule group evaluated twice (the longest-interval ones once)")
    cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
    seen: dict[str, dict[str, float]] = {n: {} for n in names}
    per_rule: dict[str, list[float]] = {}
    while time.monotonic() - t0 < seconds:
        for g in _rules(url):
            if g["name"] in names and g["lastEvaluation"] not in seen[g["name"]]:
                seen[g["name"]][g["lastEvaluation"]] = float(g["evaluationTime"])
                for r in g["rules"]:
                    per_rule.setdefault(r["name"], []).append(float(r["evaluationTime"]))
                    if r.get("health") == "err":
                        raise RuntimeError(f"rule {r['name']} failed: {r.get('lastError')}")
        time.sleep(1.0)
    cpu = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0) - idle
    eval_s = {n: statistics.median(list(v.values())) for n, v in seen.items() if v}
    if os.environ.get("RULES_EVAL_PER_RULE"):  # where the time goes, for tuning
        for name, v in sorted(per_rule.items(), key=lambda kv: -statistics.median(kv[1]))[:12]:
            print(f"    {name}: {statistics.median(v) * 1000:.1f} ms", flush=True)
    return {
        "rule_cpu_cores": round(cpu, 4),
        "eval_per_s": round(sum(eval_s[n] / intervals[n] for n in eval_s), 4),
        "worst_group_share_of_interval": round(max(eval_s[n] / intervals[n] for n in eval_s), 3),
        # a group slower than its interval skips rounds: the CPU figure is then a floor
        "valid": max(eval_s[n] / intervals[n] for n in eval_s) <= 1,
        "groups_ms": {n: round(v * 1000, 1) for n, v in sorted(eval_s.items(),
                                                               key=lambda kv: -kv[1])},
        "intervals_s": {n: intervals[n] for n in sorted(intervals) if intervals[n] !=
                        PRODUCTION_INTERVAL},
    }


def _data_dir(cache: Path | None, work: Path, gpus: int, args: argparse.Namespace,
              now: int, run_seconds: float) -> tuple[Path, dict[str, Any] | None]:
    """The data directory for this size, and its metadata if a cached one is still usable:
    its future samples reach past this run, and the head accepts this run's recorded
    samples in order (they must not be older than its newest sample minus 1 h)."""
    if cache is None:
        return work / f"data-{gpus}", None
    data = cache / f"gpus-{gpus}-step-{args.step}"
    meta_path = data / "trainwatch-fleet.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        meta = None
    if meta and (meta["fleet_version"] == FLEET_VERSION and meta["history_start"]
                 <= now - args.history_minutes * 60 and meta["end"] - 3600 <= now
                 and now + run_seconds <= meta["end"]):
        return data, meta
    shutil.rmtree(data, ignore_errors=True)
    return data, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="1024,4096,8192",
                        help="comma-separated fleet sizes (GPUs = ranks), multiples of 8")
    parser.add_argument("--step", type=int, default=60, help="seconds between samples")
    parser.add_argument("--history-minutes", type=int, default=80,
                        help="history before now; the longest rule window is 75 min")
    parser.add_argument("--future-minutes", type=int, default=45,
                        help="samples ahead of now: how long a --cache-dir entry stays usable")
    parser.add_argument("--measure-seconds", type=float, default=120.0,
                        help="measuring window per variant, at least; rounded up to a "
                             "multiple of the longest group interval (5m: 300 s)")
    parser.add_argument("--cache-dir", type=Path,
                        help="keep each size's Prometheus data here and reuse it while valid")
    args = parser.parse_args()
    sizes = [int(s) for s in args.gpus.split(",")]
    if any(s % synthetic_fleet.GPUS_PER_NODE or not 8 <= s <= 16384 for s in sizes):
        parser.error("--gpus: multiples of 8 between 8 and 16384")
    if not 15 <= args.step <= 300 or not 30 <= args.measure_seconds <= 1200:
        parser.error("--step must be 15..300 s and --measure-seconds 30..1200")
    if args.history_minutes < 75 or args.future_minutes < 10 \
            or args.history_minutes + args.future_minutes > 170:
        parser.error("--history-minutes >= 75, --future-minutes >= 10, together <= 170 "
                     "(a longer span starts head compaction during the run)")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        variants = {"with": rule_files(True, work / "with"),
                    "without": rule_files(False, work / "without")}
        rule_count = {k: sum(len(g["rules"]) for f in v
                             for g in yaml.safe_load(f.read_text())["groups"])
                      for k, v in variants.items()}
        longest = max(i for files in variants.values()
                      for i in group_intervals(files).values())
        window = -(-args.measure_seconds // longest) * longest
        run_seconds = len(variants) * (window + longest + 300) + 120
        for gpus in sizes:
            now = int(time.time()) // args.step * args.step
            data, meta = _data_dir(args.cache_dir, work, gpus, args, now, run_seconds)
            data.mkdir(parents=True, exist_ok=True)
            began = time.perf_counter()
            with prometheus(work, data) as (url, proc):
                if meta is None:
                    start = now - args.history_minutes * 60
                    end = now + args.future_minutes * 60
                    series = synthetic_fleet.push(url, gpus // synthetic_fleet.GPUS_PER_NODE,
                                                  start, end, args.step)
                    meta = {"fleet_version": FLEET_VERSION, "history_start": start,
                            "end": end, "series": series}
                    (data / "trainwatch-fleet.json").write_text(json.dumps(meta))
                    how = "pushed"
                else:
                    how = "reused from the cache"
                load_s = time.perf_counter() - began
                idle = idle_cpu(proc, 20.0)
                row: dict[str, Any] = {"gpus": gpus, "ranks": gpus, "series": meta["series"],
                                       "window_s": window,
                                       "load_s": round(load_s, 1), "history": how,
                                       "idle_cpu_cores": round(idle, 4)}
                for variant, files in variants.items():
                    load_rules(url, work / "prometheus.yml", files)
                    row[variant] = measure(url, proc, files, idle, window)
            results.append(row)
            w, wo = row["with"], row["without"]
            print(f"{gpus} GPUs / {gpus} ranks ({meta['series']} series, {how} in "
                  f"{load_s:.0f} s): rule CPU with recordings {w['rule_cpu_cores']:.3f} cores "
                  f"({w['rule_cpu_cores'] / BUDGET_CORES * 10:.1f}% of 15 s per 15 s), without "
                  f"{wo['rule_cpu_cores']:.3f}; with / without "
                  f"{w['rule_cpu_cores'] / wo['rule_cpu_cores']:.2f}x; evaluation time per s "
                  f"{w['eval_per_s']:.3f} / {wo['eval_per_s']:.3f}; worst group "
                  f"{w['worst_group_share_of_interval']:.2f} of its interval", flush=True)
            for variant in variants:
                if row[variant]["worst_group_share_of_interval"] > 1:
                    print(f"  WARNING {variant}: a group took longer than its interval, so "
                          "Prometheus skipped rounds and the rule CPU is a lower bound, "
                          "capped by the CPU this machine gave it", flush=True)
            print(f"  groups with (ms): {w['groups_ms']}", flush=True)
            print(f"  groups without (ms): {wo['groups_ms']}", flush=True)
    base = results[0]
    for row in results[1:]:
        print(f"{row['gpus']} / {base['gpus']} GPUs = {row['gpus'] / base['gpus']:.0f}x: "
              f"rule CPU with {row['with']['rule_cpu_cores'] / base['with']['rule_cpu_cores']:.2f}x"
              f", without "
              f"{row['without']['rule_cpu_cores'] / base['without']['rule_cpu_cores']:.2f}x")
    load = os.getloadavg()
    last = results[-1]["with"]
    print(json.dumps({
        "benchmark": "rules_eval", "step_s": args.step, "rules": rule_count,
        "production_interval_s": PRODUCTION_INTERVAL, "budget_cores": BUDGET_CORES,
        "results": results,
        "share_of_budget_at_largest": round(last["rule_cpu_cores"] / BUDGET_CORES, 3),
        "growth_with_vs_gpus": round(
            (last["rule_cpu_cores"] / base["with"]["rule_cpu_cores"])
            / (results[-1]["gpus"] / base["gpus"]), 3),
        "loadavg_1m_at_end": round(load[0], 2),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, Python "
                   f"{platform.python_version()}",
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
