"""Cost of the goodput accounting (issue 24): report() and the step loop, before and after, in
one run.

    PYTHONPATH=. .venv/bin/python benchmarks/goodput.py [--calls 20000] [--rounds 30]

"Before" is a TrainingMonitor whose goodput account does nothing (the code as it was: no
per-row accounting on the shipper, no goodput member in the datagram); "after" is the
monitor as shipped. Both run at once against one real training-exporter, and the two are
measured in short interleaved chunks in rotating order, because this shared machine's speed
drifts by tens of percent over seconds:
  1. report() per call (perf_counter_ns, median and p99 of each variant), and a second
     "before" monitor as the control (control/before = the noise floor of after/before);
  2. a loop of ~10 ms steps (torch matmuls, one thread) with report + step_end, wall time per
     chunk; plus each variant's shipper thread CPU per step (the accounting runs there).
The last line printed is a JSON object with every figure and the after/before ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.exporter_process import start_exporter
from benchmarks.training_client import (
    INFO,
    ten_ms_step,
    thread_cpu_seconds,
    time_calls,
)
from trainwatch.exporters.rank.client import TrainingMonitor


class NoAccount:
    """The goodput account switched off: the shipper's cost without goodput accounting."""

    def step(self, at: float, data_wait: float | None) -> None:
        pass

    def finish(self, at: float) -> None:
        pass

    def wire(self, now: float) -> None:
        return None


VARIANTS = ("before", "after", "control")
ORDERS = (("before", "after", "control"), ("after", "control", "before"),
          ("control", "before", "after"))


def monitors(sock: Path) -> dict[str, TrainingMonitor]:
    """before, after, and a second "before" as the control: control/before is the noise
    floor of after/before on this machine."""
    out = {}
    for name in VARIANTS:
        out[name] = TrainingMonitor(rank_info=INFO, socket_path=str(sock), control=False)
        if name != "after":
            out[name]._shared.goodput = NoAccount()  # type: ignore[assignment]
    return out


def bench_report(mons: dict[str, TrainingMonitor], calls: int, rounds: int) -> dict[str, Any]:
    samples: dict[str, list[int]] = {name: [] for name in VARIANTS}
    chunk = max(calls // rounds, 100)
    for i in range(rounds):
        for name in ORDERS[i % 3]:
            monitor = mons[name]

            def report(step: int, m: TrainingMonitor = monitor) -> None:
                m.report(step, loss=0.5, lr=1e-4, grad_norm=1.25, samples=32, tokens=4096,
                         data_wait=0.001)

            samples[name] += time_calls(report, chunk)
            monitor._shipper.wake.set()  # let the shipper drain now: the buffer never overflows
            time.sleep(0.02)
    out: dict[str, Any] = {}
    for name, values in samples.items():
        ordered = sorted(values)
        out[name] = {"median_us": ordered[len(ordered) // 2] / 1000,
                     "p99_us": ordered[int(len(ordered) * 0.99)] / 1000}
    for key in ("median", "p99"):
        out[f"ratio_{key}"] = round(out["after"][f"{key}_us"] / out["before"][f"{key}_us"], 3)
        out[f"control_{key}"] = round(out["control"][f"{key}_us"]
                                      / out["before"][f"{key}_us"], 3)
    return out


def bench_loop(mons: dict[str, TrainingMonitor], chunk: int, rounds: int) -> dict[str, Any]:
    step_compute = ten_ms_step()
    steps = dict.fromkeys(VARIANTS, 0)
    cpu_start = {n: thread_cpu_seconds(m._shipper.native_id) for n, m in mons.items()}

    def run(name: str) -> float:
        monitor = mons[name]
        begin = time.perf_counter()
        for _ in range(chunk):
            step_compute()
            monitor.report(steps[name], loss=0.5, grad_norm=1.0, samples=32, data_wait=0.001)
            monitor.step_end(steps[name])
            steps[name] += 1
        return time.perf_counter() - begin

    ratios, controls = [], []
    totals = dict.fromkeys(VARIANTS, 0.0)
    for i in range(rounds):
        times = {}
        for name in ORDERS[i % 3]:
            times[name] = run(name)
            totals[name] += times[name]
        ratios.append(times["after"] / times["before"])
        controls.append(times["control"] / times["before"])
    cpu = {n: (thread_cpu_seconds(m._shipper.native_id) or 0.0) - (cpu_start[n] or 0.0)
           for n, m in mons.items()}
    return {"step_ms": round(totals["before"] / steps["before"] * 1000, 3),
            "steps_each": steps["before"],
            "ratio_median": round(statistics.median(ratios), 4),
            "ratio_totals": round(totals["after"] / totals["before"], 4),
            "control_median": round(statistics.median(controls), 4),
            "shipper_cpu_us_per_step": {n: round(cpu[n] / max(steps[n], 1) * 1e6, 2)
                                        for n in cpu}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--loop-chunk", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, sock = start_exporter(Path(tmp))
        try:
            mons = monitors(sock)
            result = {"machine": platform.processor() or platform.machine(),
                      "python": sys.version.split()[0],
                      "report": bench_report(mons, args.calls, args.rounds),
                      "loop": bench_loop(mons, args.loop_chunk, args.rounds)}
            for monitor in mons.values():
                monitor.close()
            result["dropped"] = {n: m.stats()["dropped"] for n, m in mons.items()}
        finally:
            proc.terminate()
            proc.wait(10)
    rep, loop = result["report"], result["loop"]
    print(f"report(): before {rep['before']}, after {rep['after']} (after/before median "
          f"{rep['ratio_median']}, p99 {rep['ratio_p99']}; control/before median "
          f"{rep['control_median']}, p99 {rep['control_p99']})")
    print(f"step loop ({loop['step_ms']} ms steps): after/before {loop['ratio_median']} "
          f"(median of rounds; control/before {loop['control_median']}), shipper CPU per "
          f"step {loop['shipper_cpu_us_per_step']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
