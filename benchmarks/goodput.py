"""Cost of the goodput accounting (issue 24): report() and the step loop, before and after, in
one run.

    PYTHONPATH=. .venv/bin/python benchmarks/goodput.py [--calls 20000] [--rounds 30]

"Before" is a TrainingMonitor whose goodput account does nothing (the code as it was: no
per-row accounting on the shipper, no goodput member in the datagram); "after" is the
monitor as shipped. Both run at once against one real training-exporter, and the two are
measured in short interleaved chunks in rotating order, because this shared machine's speed
drifts by tens of percent over seconds:
  1. report() per call (perf_counter_ns, median and p99 of each variant);
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

from benchmarks.training_client import (
    INFO,
    start_exporter,
    thread_cpu_seconds,
    time_calls,
)
from exporters.training.client import TrainingMonitor


class NoAccount:
    """The goodput account switched off: what the shipper did before issue 24."""

    def step(self, at: float, data_wait: float | None) -> None:
        pass

    def finish(self, at: float) -> None:
        pass

    def wire(self) -> None:
        return None


def monitors(sock: Path) -> dict[str, TrainingMonitor]:
    before = TrainingMonitor(rank_info=INFO, socket_path=str(sock), control=False)
    before._goodput = NoAccount()  # type: ignore[assignment]
    after = TrainingMonitor(rank_info=INFO, socket_path=str(sock), control=False)
    return {"before": before, "after": after}


def bench_report(mons: dict[str, TrainingMonitor], calls: int, rounds: int) -> dict[str, Any]:
    samples: dict[str, list[int]] = {"before": [], "after": []}
    chunk = max(calls // rounds, 100)
    for i in range(rounds):
        for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
            monitor = mons[name]

            def report(step: int, m: TrainingMonitor = monitor) -> None:
                m.report(step, loss=0.5, lr=1e-4, grad_norm=1.25, samples=32, tokens=4096,
                         data_wait=0.001)

            samples[name] += time_calls(report, chunk)
            time.sleep(0.01)  # let the shippers drain: the buffer never overflows
    out: dict[str, Any] = {}
    for name, values in samples.items():
        ordered = sorted(values)
        out[name] = {"median_us": ordered[len(ordered) // 2] / 1000,
                     "p99_us": ordered[int(len(ordered) * 0.99)] / 1000}
    out["ratio_median"] = round(out["after"]["median_us"] / out["before"]["median_us"], 3)
    out["ratio_p99"] = round(out["after"]["p99_us"] / out["before"]["p99_us"], 3)
    return out


def bench_loop(mons: dict[str, TrainingMonitor], chunk: int, rounds: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(192, 192)

    def work(reps: int) -> None:
        for _ in range(reps):
            torch.mm(a, a)

    work(200)
    start = time.perf_counter()
    work(100)
    reps = max(1, round(0.010 / ((time.perf_counter() - start) / 100)))
    steps = {"before": 0, "after": 0}
    cpu_start = {n: thread_cpu_seconds(m._shipper.native_id) for n, m in mons.items()}

    def run(name: str) -> float:
        monitor = mons[name]
        begin = time.perf_counter()
        for _ in range(chunk):
            work(reps)
            monitor.report(steps[name], loss=0.5, grad_norm=1.0, samples=32, data_wait=0.001)
            monitor.step_end(steps[name])
            steps[name] += 1
        return time.perf_counter() - begin

    ratios = []
    totals = {"before": 0.0, "after": 0.0}
    for i in range(rounds):
        times = {}
        for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
            times[name] = run(name)
            totals[name] += times[name]
        ratios.append(times["after"] / times["before"])
    cpu = {n: (thread_cpu_seconds(m._shipper.native_id) or 0.0) - (cpu_start[n] or 0.0)
           for n, m in mons.items()}
    return {"step_ms": round(totals["before"] / steps["before"] * 1000, 3),
            "steps_each": steps["before"],
            "ratio_median": round(statistics.median(ratios), 4),
            "ratio_totals": round(totals["after"] / totals["before"], 4),
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
    print(f"report(): before {result['report']['before']}, after {result['report']['after']}"
          f" (median ratio {result['report']['ratio_median']})")
    print(f"step loop ({result['loop']['step_ms']} ms steps): after/before "
          f"{result['loop']['ratio_median']} (median of rounds), shipper CPU per step "
          f"{result['loop']['shipper_cpu_us_per_step']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
