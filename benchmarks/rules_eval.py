"""Benchmark how the cost of evaluating Trainwatch's production rules grows with the fleet.

    .venv/bin/python benchmarks/rules_eval.py [--gpus 1024,4096,8192] [--step 60]

For each fleet size (GPUs = ranks: nodes x 8 GPUs, one training job with one rank per GPU) a
synthetic history is backfilled into a real Prometheus TSDB with `promtool tsdb
create-blocks-from openmetrics` (one sample per series every --step seconds, from
--history-minutes ago to --future-minutes ahead, so every window the rules read is full while
Prometheus evaluates them at wall-clock time; the out-of-order window lets the rule manager
write its recorded series below the backfilled blocks' end). A real Prometheus then loads the
production rule files and evaluates them itself at --interval; after --rounds rounds the
rule groups' `evaluationTime` is read from /api/v1/rules (the median of the rounds per group,
summed over all groups: groups run concurrently, so the sum is the CPU they need, an upper
bound of the wall time).

Baseline in the same run, on the same TSDB: the same rules generated with
`aggregate_per_job_and_node: false` (alerts read every rank and GPU series themselves, as
before the per-job / per-node recording rules). Ratios printed: with / without, and each
size / the smallest (linear growth = the GPU ratio). The budget compares one round with the
production evaluation interval (15 s).

Prints one line per result and, last, a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from alert_rules import generate  # noqa: E402
from alert_rules.config import CONFIG_PATH, load_raw, resolve  # noqa: E402
from exporters.catalog import PORTS  # noqa: E402
from tests.support.net import free_port, wait_until  # noqa: E402
from tests.support.procs import running  # noqa: E402

PRODUCTION_INTERVAL = 15.0  # seconds: the prometheus role's prometheus_evaluation_interval
GPUS_PER_NODE = 8
BUCKETS = ("0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "+Inf")
REASONS = ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown")


def rule_files(aggregate: bool, out: Path) -> list[Path]:
    """The production rule files, with or without the per-job / per-node aggregation."""
    raw = load_raw(CONFIG_PATH)
    raw["defaults"]["aggregate_per_job_and_node"] = aggregate
    rendered = generate.render(resolve(raw, "production"))
    return generate.write(out, {"production": rendered})


def _series(nodes: int) -> Iterator[tuple[str, str, str, str]]:
    """(type line, sample name, labels, value kind) for every synthetic series."""
    for n in range(nodes):
        host = f"node{n:04d}"
        node = f'job="node",instance="{host}:{PORTS["node_exporter"]}"'
        gpu_inst = f'job="gpu",instance="{host}:{PORTS["gpu_exporter"]}"'
        train_inst = f'job="training",instance="{host}:{PORTS["training_exporter"]}"'
        for inst in (node, gpu_inst, train_inst):
            yield "up gauge", "up", inst, "one"
        fs = f'{node},device="/dev/nvme0n1",fstype="ext4",mountpoint="/data"'
        yield "node_filesystem_avail_bytes gauge", "node_filesystem_avail_bytes", fs, "disk"
        yield "node_filesystem_size_bytes gauge", "node_filesystem_size_bytes", fs, "1e12"
        yield "node_filesystem_readonly gauge", "node_filesystem_readonly", fs, "zero"
        yield "node_memory_MemAvailable_bytes gauge", "node_memory_MemAvailable_bytes", node, "2e11"
        yield "node_memory_MemTotal_bytes gauge", "node_memory_MemTotal_bytes", node, "5e11"
        yield ("trainwatch_gpu_exporter_last_success_timestamp_seconds gauge",
               "trainwatch_gpu_exporter_last_success_timestamp_seconds", gpu_inst, "ts")
        for g in range(GPUS_PER_NODE):
            gl = f'{gpu_inst},gpu="{g}",uuid="GPU-{n}-{g}",name="H100"'
            yield "trainwatch_gpu_up gauge", "trainwatch_gpu_up", gl, "one"
            yield "trainwatch_gpu_temperature_celsius gauge", \
                "trainwatch_gpu_temperature_celsius", gl, "temp"
            yield "trainwatch_gpu_utilization_ratio gauge", "trainwatch_gpu_utilization_ratio", \
                gl, "0.9"
            yield "trainwatch_gpu_memory_used_bytes gauge", "trainwatch_gpu_memory_used_bytes", \
                gl, "6e10"
            yield "trainwatch_gpu_memory_total_bytes gauge", \
                "trainwatch_gpu_memory_total_bytes", gl, "8e10"
            yield "trainwatch_gpu_row_remap_failure gauge", "trainwatch_gpu_row_remap_failure", \
                gl, "zero"
            for reason in REASONS:
                yield "trainwatch_gpu_clock_event_reason_active gauge", \
                    "trainwatch_gpu_clock_event_reason_active", f'{gl},reason="{reason}"', "zero"
            for err in ("corrected", "uncorrected"):
                yield "trainwatch_gpu_ecc_errors counter", "trainwatch_gpu_ecc_errors_total", \
                    f'{gl},error_type="{err}",counter="volatile"', "zero"
            rl = f'{train_inst},training_job="llm",rank="{n * GPUS_PER_NODE + g}",node="{host}"'
            yield "training_step gauge", "training_step", rl, "steps"
            yield "training_loss gauge", "training_loss", rl, "loss"
            yield "training_grad_norm gauge", "training_grad_norm", rl, "0.5"
            yield "training_last_step_timestamp_seconds gauge", \
                "training_last_step_timestamp_seconds", rl, "ts"
            yield "training_heartbeat_timestamp_seconds gauge", \
                "training_heartbeat_timestamp_seconds", rl, "ts"
            yield "training_collective_sequence gauge", "training_collective_sequence", rl, \
                "steps"
            yield "training_finished gauge", "training_finished", rl, "zero"
            yield "training_peak_flops_per_second gauge", "training_peak_flops_per_second", \
                rl, "9.89e14"
            yield "training_samples counter", "training_samples_total", rl, "steps8"
            yield "training_tokens counter", "training_tokens_total", rl, "steps8192"
            yield "training_model_flops counter", "training_model_flops_total", rl, "flops"
            yield "training_nonfinite_loss counter", "training_nonfinite_loss_total", rl, "zero"
            fam = "training_step_duration_seconds histogram"
            for le in BUCKETS:
                kind = "steps" if le in ("2.5", "5.0", "+Inf") else "zero"
                yield fam, "training_step_duration_seconds_bucket", f'{rl},le="{le}"', kind
            yield fam, "training_step_duration_seconds_sum", rl, "steps2"
            yield fam, "training_step_duration_seconds_count", rl, "steps"


def _value(kind: str, ts: int, t: int) -> str:
    steps = t // 2
    match kind:
        case "one":
            return "1"
        case "zero":
            return "0"
        case "ts":
            return str(ts)
        case "steps":
            return str(steps)
        case "steps2":
            return str(steps * 2)
        case "steps8":
            return str(steps * 8)
        case "steps8192":
            return str(steps * 8192)
        case "flops":
            return str(steps * 1e15)
        case "loss":
            return f"{2.0 + 1.0 / (1 + steps / 100):.6f}"
        case "temp":
            return str(60 + (t // 60) % 7)
        case "disk":
            return str(5e11 - t * 1e4)
        case _:
            return kind


def write_fleet(path: Path, nodes: int, start: int, end: int, step: int) -> int:
    """OpenMetrics text of the fleet into `path` (families contiguous); returns the series."""
    by_family: dict[str, list[tuple[str, str, str]]] = {}
    for type_line, name, labels, kind in _series(nodes):
        by_family.setdefault(type_line, []).append((name, labels, kind))
    stamps = range(start, end, step)
    count = 0
    with path.open("w", buffering=1 << 22) as out:
        for type_line, members in by_family.items():
            out.write(f"# TYPE {type_line}\n")
            for name, labels, kind in members:
                count += 1
                out.write("".join(f"{name}{{{labels}}} {_value(kind, ts, ts - start)} {ts}\n"
                                  for ts in stamps))
        out.write("# EOF\n")
    return count


def evaluate(work: Path, data: Path, files: list[Path], interval: float,
             rounds: int) -> dict[str, float]:
    """Let a real Prometheus evaluate `files`; group name -> median evaluationTime (s)."""
    config = work / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"evaluation_interval": f"{int(interval)}s"},
        "rule_files": [str(f) for f in files],
        "storage": {"tsdb": {"out_of_order_time_window": "3h"}},
    }))
    port = int(data.name.rsplit("-", 1)[1])
    url = f"http://127.0.0.1:{port}"
    argv = ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d",
            "--log.level=warn"]
    seen: dict[str, list[float]] = {}
    per_rule: dict[str, list[float]] = {}
    last: dict[str, str] = {}
    # opening the backfilled blocks of a large fleet takes longer than a test's 30 s
    with running(argv, work / f"prometheus-{port}.log", ready_url=f"{url}/-/ready",
                 timeout=600):
        def enough() -> bool:
            body = requests.get(f"{url}/api/v1/rules", timeout=30).json()
            for group in body["data"]["groups"]:
                name, at = group["name"], group["lastEvaluation"]
                if at.startswith("0001-") or last.get(name) == at:
                    continue
                last[name] = at
                seen.setdefault(name, []).append(float(group["evaluationTime"]))
                for rule in group["rules"]:
                    key = f"rule {rule['name']}"
                    per_rule.setdefault(key, []).append(float(rule["evaluationTime"]))
            # the first round pays for cold caches: keep `rounds` after it
            return len(seen) == len(_group_names(files)) and all(
                len(v) > rounds for v in seen.values())

        wait_until(enough, timeout=interval * (rounds + 4) + 120, interval=1.0,
                   what="rule groups completing their evaluation rounds")
        errors = [r for g in requests.get(f"{url}/api/v1/rules", timeout=30).json()["data"][
            "groups"] for r in g["rules"] if r.get("health") == "err"]
        if errors:
            raise RuntimeError(f"rules failed: {errors[:2]}")
    if os.environ.get("RULES_EVAL_PER_RULE"):  # where the time goes, for tuning
        for name, v in sorted(per_rule.items(), key=lambda kv: -statistics.median(kv[1]))[:12]:
            print(f"    {name}: {statistics.median(v) * 1000:.1f} ms", flush=True)
    return {name: statistics.median(v[1:]) for name, v in seen.items()}


def _group_names(files: list[Path]) -> list[str]:
    return [g["name"] for f in files for g in yaml.safe_load(f.read_text())["groups"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="1024,4096,8192",
                        help="comma-separated fleet sizes (GPUs = ranks), multiples of 8")
    parser.add_argument("--step", type=int, default=60, help="seconds between samples")
    parser.add_argument("--history-minutes", type=int, default=80)
    parser.add_argument("--future-minutes", type=int, default=15)
    parser.add_argument("--interval", type=float, default=10.0,
                        help="evaluation interval of the benchmark's Prometheus (s)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.gpus.split(",")]
    if any(s % GPUS_PER_NODE or not 8 <= s <= 16384 for s in sizes):
        parser.error("--gpus: multiples of 8 between 8 and 16384")
    if not 15 <= args.step <= 300 or not 1 <= args.rounds <= 10:
        parser.error("--step must be 15..300 s and --rounds 1..10")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        variants = {"with": rule_files(True, work / "with"),
                    "without": rule_files(False, work / "without")}
        rule_count = {k: sum(len(g["rules"]) for f in v
                             for g in yaml.safe_load(f.read_text())["groups"])
                      for k, v in variants.items()}
        for gpus in sizes:
            now = int(time.time()) // args.step * args.step
            start = now - args.history_minutes * 60
            end = now + args.future_minutes * 60
            source = work / "fleet.om"
            began = time.perf_counter()
            series = write_fleet(source, gpus // GPUS_PER_NODE, start, end, args.step)
            data = work / f"prom-data-{free_port()}"
            subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                            str(source), str(data)], check=True, capture_output=True)
            source.unlink()
            backfill = time.perf_counter() - began
            row = {"gpus": gpus, "ranks": gpus, "series": series,
                   "backfill_s": round(backfill, 1)}
            for variant, files in variants.items():
                groups = evaluate(work, data, files, args.interval, args.rounds)
                row[f"{variant}_ms"] = round(sum(groups.values()) * 1000, 1)
                row[f"{variant}_slowest"] = {k: round(v * 1000, 1) for k, v in sorted(
                    groups.items(), key=lambda kv: -kv[1])[:3]}
            subprocess.run(["rm", "-rf", str(data)], check=True)
            results.append(row)
            print(f"{gpus} GPUs / {gpus} ranks ({series} series, backfill {backfill:.0f} s): "
                  f"with aggregation {row['with_ms']:.1f} ms "
                  f"({row['with_ms'] / PRODUCTION_INTERVAL / 10:.2f}% of 15 s), "
                  f"without {row['without_ms']:.1f} ms; with / without "
                  f"{row['with_ms'] / row['without_ms']:.2f}x", flush=True)
            print(f"  slowest with: {row['with_slowest']}", flush=True)
            print(f"  slowest without: {row['without_slowest']}", flush=True)
    base = results[0]
    for row in results[1:]:
        print(f"{row['gpus']} / {base['gpus']} GPUs = {row['gpus'] / base['gpus']:.0f}x: "
              f"cost with {row['with_ms'] / base['with_ms']:.2f}x, "
              f"without {row['without_ms'] / base['without_ms']:.2f}x")
    load = os.getloadavg()
    print(json.dumps({
        "benchmark": "rules_eval", "step_s": args.step, "rules": rule_count,
        "production_interval_s": PRODUCTION_INTERVAL, "results": results,
        "fraction_of_interval_at_largest": round(
            results[-1]["with_ms"] / 1000 / PRODUCTION_INTERVAL, 5),
        "growth_with_vs_gpus": round((results[-1]["with_ms"] / base["with_ms"])
                                     / (results[-1]["gpus"] / base["gpus"]), 3),
        "loadavg_1m_at_end": round(load[0], 2),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, Python "
                   f"{platform.python_version()}",
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
