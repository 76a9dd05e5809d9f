"""Cost of one training-step report on the training thread, against the designs it replaces.

    .venv/bin/python benchmarks/training_client.py [--calls 20000] [--loop-rounds 60]

Measured in one run, each call timed individually with perf_counter_ns (timer cost included
for all three alike):
  1. TrainingMonitor.report(...) with the real training-exporter draining the socket;
  2. the seed article's design: rewrite a JSON file of the same values on every step
     (the exporter polls it; ../shared/baselines/README.md);
  3. prometheus_client Gauge.set of the same values (label children resolved once up front,
     the cheapest way to use it).
Then a loop of ~10 ms steps (torch matmuls, single thread, like a small training step), with
report + step_end on and off in interleaved short chunks plus an off/off control for the
noise floor, and the library's CPU accounted directly (see bench_loop for why).
Then the cost of a sync step with no new commands (the in-band agreement's common path,
trainwatch.exporters.rank.sync.Agreement.exchange) at 2 and 4 gloo ranks, next to a 1-float
all-reduce and the former unconditional all_gather_object, interleaved in the same run
(`--only sync` runs just that part).
Then (issue 28, `--runs 400,2000`; `--only runs` runs just that part) whole runs of a training
loop without Trainwatch and with the client plus an asynchronous checkpoint every 50 steps,
each run in a fresh process so the checkpoint writer's start-up is paid, start-up shown
apart: benchmarks/checkpoint.py's part 3, the same code (`bench_runs`).
The last line printed is a JSON object with every figure and ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

# run as a script (docs/performance.md), `benchmarks.` modules resolve from this tree too
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.exporter_process import start_exporter
from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank.client import TrainingMonitor

INFO = RankInfo("bench", 0, 0, 1, 0)


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    return {"median_us": ordered[len(ordered) // 2] / 1000,
            "p99_us": ordered[int(len(ordered) * 0.99)] / 1000}


def time_calls(call: Callable[[int], None], count: int) -> list[int]:
    clock = time.perf_counter_ns
    samples = []
    for i in range(count):
        start = clock()
        call(i)
        samples.append(clock() - start)
    return samples


def bench_calls(sock: Path, workdir: Path, calls: int) -> dict[str, dict[str, float]]:
    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(sock), control=False)

    def report(i: int) -> None:
        monitor.report(i, loss=0.5, lr=1e-4, grad_norm=1.25, samples=32, tokens=4096,
                       data_wait=0.001)

    metrics_file = workdir / "training_metrics.json"

    def rewrite_file(i: int) -> None:
        with open(metrics_file, "w") as handle:
            json.dump({"step": i, "loss": 0.5, "lr": 1e-4, "grad_norm": 1.25, "samples": 32,
                       "tokens": 4096, "data_wait": 0.001, "timestamp": time.time()}, handle)

    registry = CollectorRegistry()
    names = ("step", "loss", "lr", "grad_norm", "samples", "tokens", "data_wait")
    gauges = [Gauge(f"bench_{n}", n, ["training_job", "rank"], registry=registry)
              .labels("bench", "0") for n in names]
    step_g, loss_g, lr_g, gn_g, samples_g, tokens_g, wait_g = gauges

    def gauge_set(i: int) -> None:
        step_g.set(i)
        loss_g.set(0.5)
        lr_g.set(1e-4)
        gn_g.set(1.25)
        samples_g.set(32)
        tokens_g.set(4096)
        wait_g.set(0.001)

    results = {}
    for name, call, count in (("report", report, calls),
                              ("file_rewrite", rewrite_file, max(calls // 10, 1000)),
                              ("gauge_set", gauge_set, calls)):
        time_calls(call, min(count, 1000))  # warm-up
        results[name] = percentiles(time_calls(call, count))
    monitor.close()
    results["report"]["dropped"] = monitor.stats()["dropped"]
    return results


def thread_cpu_seconds(native_id: int | None) -> float | None:
    """CPU time a thread of this process has used (Linux /proc), None where unavailable."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as handle:
            return int(handle.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def ten_ms_step() -> Callable[[], None]:
    """One single-threaded ~10 ms matmul step, calibrated on this machine (median of 5), the
    stand-in for a training step's compute in the loop benchmarks."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(192, 192)

    def work(reps: int) -> None:
        for _ in range(reps):
            torch.mm(a, a)

    work(200)
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        work(100)
        timings.append((time.perf_counter() - start) / 100)
    reps = max(1, round(0.010 / statistics.median(timings)))
    return lambda: work(reps)


def bench_loop(sock: Path, chunk: int, rounds: int) -> dict[str, float]:
    """Library off vs on over the same ~10 ms steps, in short interleaved chunks.

    This machine is shared and its speed drifts by tens of percent over seconds, so two long
    runs compare the machine's mood, not the library. Each round runs three adjacent chunks
    in rotating order: off, on, and off again as a control; the wall-time figure is the median
    over rounds of (on - off) / off, and the control's (off2 - off) / off is the noise floor
    of that figure on this machine. Independent of noise, the library's CPU cost is also
    accounted directly: time inside report + step_end on the training thread plus the CPU
    the shipper thread used, divided by the loop's wall time.
    """
    step_compute = ten_ms_step()

    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(sock), control=False)
    step = 0
    in_library: list[float] = []

    def run(on: bool) -> float:
        nonlocal step
        clock = time.perf_counter
        begin = clock()
        for _ in range(chunk):
            step_compute()
            if on:
                t0 = clock()
                monitor.report(step, loss=0.5, grad_norm=1.0, samples=32, tokens=4096)
                monitor.step_end(step)
                in_library.append(clock() - t0)
            step += 1
        return clock() - begin

    shipper_id = monitor._shipper.native_id
    shipper_cpu_start = thread_cpu_seconds(shipper_id)
    on_ratios, control_ratios = [], []
    totals = {"off": 0.0, "on": 0.0, "control": 0.0}
    orders = (("off", "on", "control"), ("on", "control", "off"), ("control", "off", "on"))
    for i in range(rounds):
        times = {}
        for mode in orders[i % 3]:
            times[mode] = run(mode == "on")
            totals[mode] += times[mode]
        on_ratios.append((times["on"] - times["off"]) / times["off"])
        control_ratios.append((times["control"] - times["off"]) / times["off"])
    shipper_cpu_end = thread_cpu_seconds(shipper_id)
    monitor.close()
    shipper_cpu = (shipper_cpu_end - shipper_cpu_start
                   if shipper_cpu_start is not None and shipper_cpu_end is not None else None)
    result = {"step_ms": round(totals["off"] / (rounds * chunk) * 1000, 3),
              "chunk_steps": chunk, "rounds": rounds,
              "off_total_s": round(totals["off"], 4), "on_total_s": round(totals["on"], 4),
              "wall_overhead_pct": round(statistics.median(on_ratios) * 100, 3),
              "wall_overhead_pct_totals": round((totals["on"] - totals["off"]) / totals["off"]
                                                * 100, 3),
              "wall_noise_floor_pct": round(statistics.median(control_ratios) * 100, 3),
              # Right after a step's matmuls evicted the caches, any Python code is slower
              # than in a tight loop (a no-op call costs ~4 us here), and the mean also
              # catches the moments the OS preempted the thread: both are shown.
              "training_thread_us_per_step_median": round(
                  statistics.median(in_library) * 1e6, 3),
              "training_thread_us_per_step_mean": round(
                  sum(in_library) / len(in_library) * 1e6, 3)}
    shipper = shipper_cpu or 0.0
    result["cpu_overhead_pct_median"] = round(
        (statistics.median(in_library) * len(in_library) + shipper) / totals["on"] * 100, 3)
    result["cpu_overhead_pct_mean"] = round((sum(in_library) + shipper) / totals["on"] * 100, 3)
    result["shipper_cpu_s"] = round(shipper_cpu, 4) if shipper_cpu is not None else None
    return result


def _sync_rank(rank: int, world: int, port: int, iters: int, rounds: int, out: Any) -> None:
    """One rank of the sync benchmark: per round, `iters` of each variant back to back."""
    import torch
    import torch.distributed as dist

    from trainwatch.exporters.rank import sync

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    agreement = sync.Agreement()
    one = torch.zeros(1)
    variants: dict[str, Callable[[], object]] = {
        "all_reduce_1_float": lambda: dist.all_reduce(one),
        "sync_step": lambda: agreement.exchange([]),
        "all_gather_object": lambda: sync.gather([]),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    clock = time.perf_counter
    names = list(variants)
    # Calls alternate, in an order that rotates every iteration, so each variant sees the
    # same machine (this one is shared and oversubscribed at 4 ranks) and follows each
    # other variant equally often; each call is timed on its own and the median kept.
    dist.barrier()
    for i in range(iters * rounds + iters):  # the first `iters` warm up
        shift = i % 3
        for name in names[shift:] + names[:shift]:
            start = clock()
            variants[name]()
            if i >= iters:
                samples[name].append(clock() - start)
    if rank == 0:
        out.put({name: statistics.median(v) * 1e6 for name, v in samples.items()})
    dist.destroy_process_group()


def bench_sync(worlds: tuple[int, ...], iters: int, rounds: int) -> dict[str, Any]:
    """Median per-call microseconds of each variant at each world size (rank 0's view)."""
    import socket as _socket

    import torch.multiprocessing as mp

    results: dict[str, Any] = {}
    ctx = mp.get_context("spawn")
    for world in worlds:
        with _socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        out = ctx.SimpleQueue()
        mp.start_processes(_sync_rank, args=(world, port, iters, rounds, out), nprocs=world,
                           start_method="spawn")
        figures = {k: round(v, 2) for k, v in out.get().items()}
        figures["sync_over_all_reduce"] = round(figures["sync_step"]
                                                / figures["all_reduce_1_float"], 2)
        figures["gather_over_all_reduce"] = round(figures["all_gather_object"]
                                                  / figures["all_reduce_1_float"], 2)
        results[f"world_{world}"] = figures
    if len(worlds) >= 2:
        small, large = (results[f"world_{w}"] for w in (worlds[0], worlds[-1]))
        results["growth_sync"] = round(large["sync_step"] / small["sync_step"], 2)
        results["growth_all_reduce"] = round(large["all_reduce_1_float"]
                                             / small["all_reduce_1_float"], 2)
    return results


def print_sync(result: dict[str, Any]) -> None:
    for key, fig in result.items():
        if key.startswith("world_"):
            print(f"sync step, {key[6:]} ranks: all-reduce(1 float) {fig['all_reduce_1_float']} us,"
                  f" sync step (no news) {fig['sync_step']} us ({fig['sync_over_all_reduce']}x),"
                  f" old all_gather_object {fig['all_gather_object']} us "
                  f"({fig['gather_over_all_reduce']}x)")
    if "growth_sync" in result:
        print(f"growth 2->4 ranks: sync step {result['growth_sync']}x, "
              f"all-reduce {result['growth_all_reduce']}x")


def whole_runs(args: argparse.Namespace) -> dict[str, Any]:
    """benchmarks/checkpoint.py's whole-run comparison (one implementation, its defaults),
    printed. Imported here: it loads torch, which the other parts do not need."""
    from benchmarks.checkpoint import (
        RUN_ROUNDS,
        RUN_WIDTH,
        bench_runs,
        print_runs,
        run_goals,
        run_lengths,
    )

    lengths = run_lengths(args.runs)
    runs = bench_runs(lengths, RUN_ROUNDS if args.run_rounds is None else args.run_rounds,
                      RUN_WIDTH if args.run_width is None else args.run_width,
                      args.run_threads, every=50, cores=args.run_cores)
    print_runs(runs)
    runs.update(run_goals(runs, lengths))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--loop-chunk", type=int, default=10, help="steps per chunk")
    parser.add_argument("--loop-rounds", type=int, default=60, help="off/on/control rounds")
    parser.add_argument("--sync-iters", type=int, default=300, help="warm-up calls per variant")
    parser.add_argument("--sync-rounds", type=int, default=10, help="x sync-iters timed calls")
    parser.add_argument("--only", choices=("sync", "runs"), default=None)
    parser.add_argument("--runs", default="400,2000",
                        help="whole-run lengths (client + async checkpoints vs none); '' skips")
    parser.add_argument("--run-rounds", type=int, default=None,
                        help="rounds of three runs, plain and Trainwatch sandwiched "
                             "(default: benchmarks/checkpoint.py's)")
    parser.add_argument("--run-width", type=int, default=None,
                        help="width of the 4 layers of the runs' model "
                             "(default: benchmarks/checkpoint.py's)")
    parser.add_argument("--run-threads", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--run-cores", default="auto",
                        help="training thread's cores: auto, rotate, none or a list (see "
                             "benchmarks/checkpoint.py)")
    args = parser.parse_args()
    if args.only == "runs":
        runs = whole_runs(args)
        print(json.dumps({"benchmark": "training_client.runs", "runs": runs}))
        return 0
    sync_result = bench_sync((2, 4), args.sync_iters, args.sync_rounds)
    sync_goals = {
        "sync_le_1_5x_all_reduce": all(v["sync_over_all_reduce"] <= 1.5
                                       for k, v in sync_result.items() if k.startswith("world_")),
        "sync_growth_le_all_reduce_growth": sync_result["growth_sync"]
        <= sync_result["growth_all_reduce"],
    }
    if args.only == "sync":
        print_sync(sync_result)
        print(json.dumps({"benchmark": "training_client.sync", "machine": f"{platform.machine()} "
                          f"{os.cpu_count()} cpu, Python {platform.python_version()}",
                          "sync": sync_result, "goals_met": sync_goals}))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        proc, sock = start_exporter(workdir)
        try:
            calls = bench_calls(sock, workdir, args.calls)
            loop = bench_loop(sock, args.loop_chunk, args.loop_rounds)
        finally:
            proc.terminate()
            proc.wait(15)
    report_median = calls["report"]["median_us"]
    result = {
        "benchmark": "training_client",
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "report": calls["report"], "file_rewrite": calls["file_rewrite"],
        "gauge_set": calls["gauge_set"],
        "file_rewrite_over_report_median": round(calls["file_rewrite"]["median_us"]
                                                 / report_median, 1),
        "file_rewrite_over_report_p99": round(calls["file_rewrite"]["p99_us"]
                                              / calls["report"]["p99_us"], 1),
        "gauge_set_over_report_median": round(calls["gauge_set"]["median_us"] / report_median, 2),
        "loop_10ms": loop,
        "sync": sync_result,
        "runs": whole_runs(args) if args.runs.strip() else None,
    }
    result["goals_met"] = {
        "median_le_5us": report_median <= 5,
        "ge_50x_cheaper_than_file_rewrite": result["file_rewrite_over_report_median"] >= 50,
        "loop_wall_overhead_le_1pct": loop["wall_overhead_pct"] <= 1,
        **sync_goals,
    }
    print(f"report        median {report_median:8.2f} us  p99 {calls['report']['p99_us']:8.2f} us")
    for name in ("file_rewrite", "gauge_set"):
        print(f"{name:13s} median {calls[name]['median_us']:8.2f} us  "
              f"p99 {calls[name]['p99_us']:8.2f} us")
    print(f"file rewrite / report (median): {result['file_rewrite_over_report_median']}x; "
          f"Gauge.set / report: {result['gauge_set_over_report_median']}x")
    print(f"10 ms-step loop ({loop['step_ms']} ms/step measured): wall time on vs off "
          f"{loop['wall_overhead_pct']:+.2f} % median of rounds, "
          f"{loop['wall_overhead_pct_totals']:+.2f} % of totals (noise floor: off vs off "
          f"{loop['wall_noise_floor_pct']:+.2f} %); library CPU "
          f"{loop['cpu_overhead_pct_median']} % (median-based) / "
          f"{loop['cpu_overhead_pct_mean']} % (mean) of the loop; "
          f"{loop['training_thread_us_per_step_median']} us/step median on the training thread")
    print_sync(sync_result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
