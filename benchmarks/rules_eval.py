"""Benchmark the cost of evaluating Trainwatch's production rules on a synthetic fleet.

    .venv/bin/python benchmarks/rules_eval.py [--nodes 16] [--hours 2]

A fleet of --nodes nodes x 8 GPUs, one training job with one rank per GPU, is backfilled into
a real Prometheus TSDB (`promtool tsdb create-blocks-from openmetrics`, 30 s resolution, the
last --hours hours), then a real Prometheus evaluates every production rule expression as an
instant query at the end of that history (5 runs each, median). Baseline in the same run: as
many plain threshold rules (`trainwatch_gpu_temperature_celsius > 85`, the cheapest shape an
alert can have) on the same data, so the ratio shows what the windows, joins and baselines of
the real rules cost on top of the query floor. The budget ratio compares one full evaluation
round with a 15 s evaluation interval.

Prints one line per result and, last, a JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.net import free_port  # noqa: E402
from tests.support.procs import prometheus  # noqa: E402

STEP = 30
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
REASONS = ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown")


def _fleet_lines(nodes: int, start: int, end: int) -> list[str]:
    """OpenMetrics text for the fleet: one sample per series every STEP seconds."""
    out: dict[str, list[str]] = {}

    def add(family: str, kind: str, labels: str, value: float, ts: int, name: str = "") -> None:
        out.setdefault(f"# TYPE {family} {kind}", []).append(
            f"{name or family}{{{labels}}} {value} {ts}")

    for ts in range(start, end, STEP):
        t = ts - start
        for n in range(nodes):
            host = f"node{n:03d}"
            node_sel = f'job="node",instance="{host}:9100"'
            add("up", "gauge", node_sel, 1, ts)
            fs = f'{node_sel},device="/dev/nvme0n1",fstype="ext4",mountpoint="/data"'
            add("node_filesystem_avail_bytes", "gauge", fs, 5e11 - t * 1e4, ts)
            add("node_filesystem_size_bytes", "gauge", fs, 1e12, ts)
            add("node_filesystem_readonly", "gauge", fs, 0, ts)
            add("node_memory_MemAvailable_bytes", "gauge", node_sel, 2e11, ts)
            add("node_memory_MemTotal_bytes", "gauge", node_sel, 5e11, ts)
            gpu_inst = f'job="gpu",instance="{host}:9445"'
            add("up", "gauge", gpu_inst, 1, ts)
            add("trainwatch_gpu_exporter_last_success_timestamp_seconds", "gauge", gpu_inst, ts,
                ts)
            train_inst = f'job="training",instance="{host}:9446"'
            add("up", "gauge", train_inst, 1, ts)
            for g in range(8):
                gl = f'{gpu_inst},gpu="{g}",uuid="GPU-{n}-{g}",name="H100"'
                add("trainwatch_gpu_up", "gauge", gl, 1, ts)
                add("trainwatch_gpu_temperature_celsius", "gauge", gl, 60 + (t // STEP) % 7, ts)
                add("trainwatch_gpu_utilization_ratio", "gauge", gl, 0.9, ts)
                add("trainwatch_gpu_memory_used_bytes", "gauge", gl, 6e10, ts)
                add("trainwatch_gpu_memory_total_bytes", "gauge", gl, 8e10, ts)
                add("trainwatch_gpu_row_remap_failure", "gauge", gl, 0, ts)
                for reason in REASONS:
                    add("trainwatch_gpu_clock_event_reason_active", "gauge",
                        f'{gl},reason="{reason}"', 0, ts)
                for err in ("corrected", "uncorrected"):
                    add("trainwatch_gpu_ecc_errors", "counter",
                        f'{gl},error_type="{err}",counter="volatile"', 0, ts,
                        "trainwatch_gpu_ecc_errors_total")
                rank = n * 8 + g
                rl = f'{train_inst},training_job="llm",rank="{rank}",node="{host}"'
                steps = t // 2
                add("training_step", "gauge", rl, steps, ts)
                add("training_loss", "gauge", rl, 2.0 + 1.0 / (1 + steps / 100), ts)
                add("training_grad_norm", "gauge", rl, 0.5, ts)
                add("training_last_step_timestamp_seconds", "gauge", rl, ts, ts)
                add("training_samples", "counter", rl, steps * 8, ts, "training_samples_total")
                add("training_tokens", "counter", rl, steps * 8192, ts, "training_tokens_total")
                add("training_nonfinite_loss", "counter", rl, 0, ts,
                    "training_nonfinite_loss_total")
                fam = "training_step_duration_seconds"
                for bound in BUCKETS:
                    add(fam, "histogram", f'{rl},le="{bound}"', steps if bound >= 2.5 else 0, ts,
                        f"{fam}_bucket")
                add(fam, "histogram", f'{rl},le="+Inf"', steps, ts, f"{fam}_bucket")
                add(fam, "histogram", rl, steps * 2.0, ts, f"{fam}_sum")
                add(fam, "histogram", rl, steps, ts, f"{fam}_count")
    lines = []
    for header, samples in out.items():
        lines.append(header)
        lines.extend(samples)
    lines.append("# EOF")
    return lines


def _time_query(url: str, expr: str, at: float, runs: int = 5) -> float:
    durations = []
    for _ in range(runs):
        begin = time.perf_counter()
        response = requests.post(f"{url}/api/v1/query", data={"query": expr, "time": at},
                                 timeout=60)
        durations.append(time.perf_counter() - begin)
        if response.status_code != 200:
            raise RuntimeError(f"query failed: {response.text[:300]}\n{expr}")
    return statistics.median(durations)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--hours", type=float, default=2.0)
    args = parser.parse_args()
    if not 1 <= args.nodes <= 256 or not 0.25 <= args.hours <= 24:
        parser.error("--nodes must be 1..256 and --hours 0.25..24")
    rules = [r for f in sorted((REPO / "alert_rules/generated/production").glob("*.yml"))
             for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]
    end = int(time.time()) // STEP * STEP - 3600  # one hour back: away from the head block
    start = end - int(args.hours * 3600)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        port = free_port()
        data = work / f"prom-data-{port}"  # where tests.support.procs.prometheus keeps its TSDB
        source = work / "fleet.om"
        began = time.perf_counter()
        source.write_text("\n".join(_fleet_lines(args.nodes, start, end)) + "\n")
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source),
                        str(data)], check=True, capture_output=True)
        backfill = time.perf_counter() - began
        config = work / "prometheus.yml"
        config.write_text("global: {scrape_interval: 15s}\n")
        with prometheus(work, config, port=port,
                        extra_args=["--storage.tsdb.retention.time=30d"]) as url:
            at = end - STEP
            # warm the caches once, so neither side pays the first-touch cost
            for rule in rules:
                _time_query(url, rule["expr"], at, runs=1)
            timings = {r.get("alert") or r["record"]: _time_query(url, r["expr"], at)
                       for r in rules}
            baseline_one = _time_query(url, "trainwatch_gpu_temperature_celsius > 85", at)
            series = requests.get(f"{url}/api/v1/query",
                                  params={"query": "count({__name__=~\".+\"})", "time": at},
                                  timeout=60).json()["data"]["result"][0]["value"][1]
    total = sum(timings.values())
    baseline = baseline_one * len(rules)
    slowest = sorted(timings.items(), key=lambda kv: -kv[1])[:3]
    print(f"fleet: {args.nodes * 8} GPUs, {args.nodes * 8} ranks, {series} series, "
          f"{args.hours:g} h at {STEP} s (backfill {backfill:.1f} s)")
    print(f"trainwatch: {len(rules)} rules, one evaluation round {total * 1000:.1f} ms")
    print(f"baseline: {len(rules)} plain threshold rules {baseline * 1000:.1f} ms")
    print(f"trainwatch / baseline: {total / baseline:.2f}x; "
          f"round / 15 s interval: {total / 15:.4f}")
    for name, seconds in slowest:
        print(f"  slowest: {name} {seconds * 1000:.1f} ms")
    print(json.dumps({
        "benchmark": "rules_eval", "gpus": args.nodes * 8, "ranks": args.nodes * 8,
        "series": int(series), "hours": args.hours, "rules": len(rules),
        "trainwatch_round_ms": round(total * 1000, 2),
        "baseline_round_ms": round(baseline * 1000, 2),
        "ratio_vs_baseline": round(total / baseline, 3),
        "fraction_of_15s_interval": round(total / 15, 5),
        "slowest": {name: round(s * 1000, 2) for name, s in slowest},
        "machine": f"{platform.machine()} {platform.python_version()}",
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
