"""What a checkpoint costs the training thread: asynchronous vs synchronous save, same state.

    .venv/bin/python benchmarks/checkpoint.py [--saves 5] [--rounds 12] [--every 50]
                                              [--writers process,thread] [--threads N]

One process, one run, the same ~200 MB training state (an MLP of 25 M float32 parameters
plus SGD momentum) through the same CheckpointManager:
  1. blocking time of a save on the training thread, synchronous (DCP write + commit
     before it returns) against asynchronous (the CPU copy made in the background while the
     next step's forward and backward run, the optimizer step waiting for it if needed; then
     written and committed in the background): for asynchronous, the time in save() plus the
     time the next step's optimizer.step() waited; each timed `--saves` times, interleaved,
     medians compared;
  2. a training loop (forward/backward/step of that model, torch on `--threads` threads,
     by default cores - 1, so the background writer has a core as it would beside a GPU job
     whose host cores are mostly idle) in chunks of `--every` steps: without a checkpoint
     ("off"), with an asynchronous one written by each writer of `--writers` (the writer
     process, the default, and the training process's own thread, the old way), and a
     second chunk without (the noise floor), in a random order per round. Reported: the
     median over rounds of the paired overhead ratio (on vs off of the same round) in wall
     time, in wall time less the time the training thread waited for a core (run-queue
     delay from /proc/thread-self/schedstat: the other sessions' share of a shared machine),
     in CPU time of the training thread and of the training process, each with its quartiles
     and the off-vs-off noise floor; the writer process's CPU time per save; the load
     average; the share of time the training thread was blocked inside save(); and the
     seconds per chunk it was off a core without waiting for one (GIL, waits).
  3. (issue 28, `--runs 400,2000`, or `--only runs`) whole runs, each in a fresh process:
     the same loop of `--run-width` wide layers without Trainwatch ("plain") and with it
     ("trainwatch": TrainingMonitor reporting to a real training-exporter every step, its
     sync step every step's end, an asynchronous checkpoint every `--every` steps, the
     manager and monitor created in the process, so the writer process's start-up is
     paid there), alternating plain/trainwatch over `--run-rounds`; reported per length:
     the start-up (creating the manager and the monitor, until the writer is warm), the
     loop's wall time and its first 100 steps, overhead of the loop and of start-up + loop.
Also measured in part 1 (issue 28, point 10): the blocking of an asynchronous save that makes
its copy before `save()` returns (`staging="on_save"`), against the synchronous save of the
same run: the rule for the save contract (docs/training.md) is "if within 10 % of a
synchronous save, copy before returning by default; else copy in the background and guard
what Trainwatch drives".
Goals (issue 12): asynchronous blocking <= 10 % of synchronous; overhead <= 2 % (judged on
the first writer listed); issue 28: whole-run overhead of the 2,000-step run <= 2 %.
The last line printed is a JSON object with every figure and ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from exporters.rank.checkpoint import WRITERS, CheckpointManager
from exporters.rank.checkpoint_writer import shared_writer_pid

WIDTH = 2500
LAYERS = 4  # 4 x 2500 x 2500 = 25 M parameters: 100 MB of weights + 100 MB of momentum


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    return model, optimizer


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               batch: torch.Tensor, manager: CheckpointManager | None = None) -> float:
    """One step; returns the seconds it waited for a checkpoint's staging copy (the
    optimizer's pre-hook would wait there anyway; timed explicitly here)."""
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    waited = 0.0
    if manager is not None:
        started = time.perf_counter()
        manager.wait_staged()
        waited = time.perf_counter() - started
    optimizer.step()
    return waited


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for state in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in state.values()
                     if isinstance(v, torch.Tensor))
    return total


def bench_blocking(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   saves: int) -> dict[str, float]:
    """Synchronous, asynchronous (copy in the background: the default) and asynchronous with
    the copy made before save() returns ("on_save"), interleaved save by save."""
    managers = {"sync": CheckpointManager(root / "sync", model, optimizer, keep=1,
                                          asynchronous=False),
                "async": CheckpointManager(root / "async", model, optimizer, keep=1),
                "on_save": CheckpointManager(root / "on_save", model, optimizer, keep=1,
                                             staging="on_save")}
    blocking: dict[str, list[float]] = {mode: [] for mode in managers}
    background: list[float] = []
    batch = torch.randn(8, WIDTH)
    first: dict[str, float] = {}
    for mode in ("async", "on_save"):  # allocates the staging copy, kept for later saves
        started = time.perf_counter()
        managers[mode].save(0, loss=0.1)
        first[mode] = time.perf_counter() - started
        managers[mode].wait()
    for i in range(saves):
        for mode, manager in managers.items():
            started = time.perf_counter()
            manager.save(i + 1, loss=0.1)
            blocked = time.perf_counter() - started
            if mode != "sync":  # the next step overlaps the copy (if still running) and the
                blocked += train_step(model, optimizer, batch, manager)  # write
                manager.wait()
                if mode == "async":
                    background.append(time.perf_counter() - started)
            else:
                train_step(model, optimizer, batch)
            blocking[mode].append(blocked)
            if manager.failed_saves:
                raise SystemExit(f"{mode} save failed: {manager.last_failure}")
    for manager in managers.values():
        manager.close()
    sync_s = statistics.median(blocking["sync"])
    async_s = statistics.median(blocking["async"])
    on_save_s = statistics.median(blocking["on_save"])
    return {"sync_blocking_s": round(sync_s, 4), "async_blocking_s": round(async_s, 4),
            "async_until_committed_s": round(statistics.median(background), 4),
            "async_over_sync_pct": round(100 * async_s / sync_s, 2),
            "async_first_save_blocking_s": round(first["async"], 4),
            "on_save_blocking_s": round(on_save_s, 4),
            "on_save_over_sync_pct": round(100 * on_save_s / sync_s, 2),
            "on_save_first_save_blocking_s": round(first["on_save"], 4),
            "sync_samples_s": [round(x, 4) for x in blocking["sync"]],
            "async_samples_s": [round(x, 4) for x in blocking["async"]],
            "on_save_samples_s": [round(x, 4) for x in blocking["on_save"]]}


def _quartiles(values: list[float]) -> list[float]:
    """[q1, median, q3] (the spread says how far the median can be trusted)."""
    if len(values) < 2:
        return [round(values[0], 2)] * 3 if values else []
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [round(q1, 2), round(q2, 2), round(q3, 2)]


def _ci90(values: list[float], draws: int = 2000) -> list[float]:
    """Bootstrap 90 % interval of the median (seeded): how far the median itself can move
    with this many rounds on this machine."""
    pick = random.Random(90)
    medians = sorted(statistics.median(pick.choices(values, k=len(values)))
                     for _ in range(draws))
    return [round(medians[int(0.05 * draws)], 2), round(medians[int(0.95 * draws) - 1], 2)]


def bench_loop(root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               rounds: int, every: int, writers: list[str]) -> dict[str, Any]:
    """Chunks of `every` steps: "on" saves asynchronously at its start (the write overlaps
    the chunk's steps, and the chunk waits for it at its end, so it pays for all of it), "off"
    and "off2" do not save (off2 vs off is the noise floor). Each round runs the three in a
    fresh random order (seeded), so slow drifts of the machine's load fall on every mode
    alike; each round gives one paired ratio on/off and off2/off, and the medians of those
    ratios are reported with their quartiles. Every chunk is timed three ways: wall time,
    CPU time of the training thread (time.thread_time: what the save costs the thread that
    trains, insensitive to other processes taking the cores), and CPU time of the whole
    process (the background writer included: what a host core pays beside a GPU job)."""
    managers = {f"on_{writer}": CheckpointManager(root / f"loop-{writer}", model, optimizer,
                                                  keep=1, writer=writer)
                for writer in writers}
    batch = torch.randn(8, WIDTH)
    for _ in range(3):  # warm-up
        train_step(model, optimizer, batch)
    for manager in managers.values():  # the first save allocates the staging copy (and
        manager.save(0, loss=0.1)      # waits for the writer process): not steady state
        manager.wait()
    clocks = {"wall": time.perf_counter, "wall_on_or_off_cpu": _wall_not_queued,
              "thread_cpu": time.thread_time, "process_cpu": time.process_time,
              "writer_cpu": _writer_cpu}
    modes = ["off", *managers, "off2"]
    times: dict[str, dict[str, list[float]]] = {
        mode: {clock: [] for clock in clocks} for mode in modes}
    blocked = dict.fromkeys(managers, 0.0)
    step = 0
    shuffle = random.Random(50)
    for _ in range(rounds):
        order = list(modes)
        shuffle.shuffle(order)
        for mode in order:
            manager = managers.get(mode)
            started = {clock: read() for clock, read in clocks.items()}
            for i in range(every):
                if manager is not None and i == 0:
                    t0 = time.perf_counter()
                    manager.save(step, loss=0.1)
                    blocked[mode] += time.perf_counter() - t0
                waited = train_step(model, optimizer, batch, manager)
                if manager is not None:
                    blocked[mode] += waited
                step += 1
            if manager is not None:
                manager.wait()
            for clock, read in clocks.items():
                times[mode][clock].append(read() - started[clock])

    def paired(mode: str, clock: str) -> list[float]:
        return [100 * (x - off) / off for x, off in
                zip(times[mode][clock], times["off"][clock], strict=True)]

    def off_cpu_unqueued(mode: str) -> float:
        """Median seconds per chunk the training thread was neither on a core nor waiting
        for one: blocked on the GIL or on the save (what a background writer thread costs it
        beyond CPU time, and what the machine's load does not inflate)."""
        return round(statistics.median(
            x - cpu for x, cpu in zip(times[mode]["wall_on_or_off_cpu"],
                                      times[mode]["thread_cpu"], strict=True)), 4)

    result: dict[str, Any] = {
        "rounds": rounds,
        "step_ms_off": round(1000 * statistics.median(times["off"]["wall"]) / every, 2),
        "blocked_off_cpu_s_off": off_cpu_unqueued("off")}
    for clock in CLOCKS:
        noise = paired("off2", clock)
        result[f"{clock}_noise_floor_pct"] = round(statistics.median(noise), 2)
        result[f"{clock}_noise_quartiles_pct"] = _quartiles(noise)
    for mode, manager in managers.items():
        on: dict[str, Any] = {
            "step_ms": round(1000 * statistics.median(times[mode]["wall"]) / every, 2),
            "blocking_pct": round(100 * blocked[mode] / sum(times[mode]["wall"]), 2),
            "failed_saves": manager.failed_saves,
            "blocked_off_cpu_s": off_cpu_unqueued(mode),
            # CPU seconds of the writer process per save (0 for the thread writer: its
            # time is in process_cpu)
            "writer_cpu_s_per_save": round(statistics.median(times[mode]["writer_cpu"]), 3)}
        for clock in CLOCKS:
            over = paired(mode, clock)
            on[f"{clock}_overhead_pct"] = round(statistics.median(over), 2)
            on[f"{clock}_overhead_quartiles_pct"] = _quartiles(over)
            on[f"{clock}_overhead_median_ci90_pct"] = _ci90(over)
        result[mode] = on
        manager.close()
    return result


CLOCKS = ("wall", "wall_on_or_off_cpu", "thread_cpu", "process_cpu")


def _wall_not_queued() -> float:
    """Wall time minus the time the calling thread waited in the run queue for a core
    (/proc/thread-self/schedstat, field 2): what is left is its time on a core plus its time
    off it for its own reasons (the GIL, waiting for a save). On a quiet machine with a core
    to spare it is the wall time; on a shared one it removes the other sessions' share."""
    try:
        queued_ns = int(Path("/proc/thread-self/schedstat").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        queued_ns = 0
    return time.perf_counter() - queued_ns / 1e9


def _writer_cpu() -> float:
    """CPU seconds (user + system) of the shared writer process so far."""
    pid = shared_writer_pid()
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- part 3: whole runs, plain vs Trainwatch, each in a fresh process --------------------------
RUN_BATCH = 8


def run_child(mode: str, steps: int, width: int, threads: int, every: int,
              workdir: Path, socket_path: str | None) -> dict[str, Any]:
    """One whole run in this (fresh) process: the loop without Trainwatch, or with the client
    and asynchronous checkpoints; start-up (manager + monitor, writer warm) timed apart."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(LAYERS)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    batches = [torch.randn(RUN_BATCH, width, generator=torch.Generator().manual_seed(i))
               for i in range(16)]
    monitor = manager = None
    started = time.perf_counter()
    if mode == "trainwatch":
        from exporters.contract.launcher import RankInfo
        from exporters.rank.client import TrainingMonitor

        manager = CheckpointManager(workdir / "ckpt", model, optimizer, keep=1)
        monitor = TrainingMonitor(rank_info=RankInfo("bench-run", 0, 0, 1, 0),
                                  optimizer=optimizer, checkpoints=manager,
                                  socket_path=socket_path, control=False)
    startup = time.perf_counter() - started
    marks = []
    begin = time.perf_counter()
    begin_unqueued = _wall_not_queued()
    begin_cpu = time.process_time() + _writer_cpu()
    for step in range(steps):
        index = monitor.next_batch() if monitor is not None else step
        loss = model(batches[index % len(batches)]).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = loss.item()
        if monitor is not None and manager is not None:
            monitor.report(step, loss=value, samples=RUN_BATCH)
            if step > 0 and step % every == 0:
                manager.save(step, loss=value)
            monitor.step_end(step)
        if (step + 1) % 100 == 0:
            marks.append(time.perf_counter() - begin)
    if manager is not None:
        manager.wait()  # the last save is part of the run
    loop = time.perf_counter() - begin
    # the same loop on two clocks that other sessions on a shared machine move much less:
    # the training thread's wall time minus its waits for a core, and the CPU the run used
    # (this process's threads and the checkpoint writer process)
    loop_unqueued = _wall_not_queued() - begin_unqueued
    loop_cpu = time.process_time() + _writer_cpu() - begin_cpu
    result = {"mode": mode, "steps": steps, "startup_s": round(startup, 4),
              "loop_s": round(loop, 4), "loop_unqueued_s": round(loop_unqueued, 4),
              "loop_cpu_s": round(loop_cpu, 4),
              "first_100_s": round(marks[0], 4) if marks else None,
              "per_100_s": [round(b - a, 4) for a, b in zip([0.0, *marks[:-1]], marks,
                                                             strict=True)]}
    if monitor is not None and manager is not None:
        monitor.close()
        manager.close()
        result["failed_saves"] = manager.failed_saves
        result["dropped"] = monitor.stats()["dropped"]
    return result


def bench_runs(lengths: list[int], rounds: int, width: int, threads: int,
               every: int) -> dict[str, Any]:
    """Per run length: `rounds` pairs of fresh processes, plain then trainwatch, the order
    swapped every round; medians and the paired overheads."""
    from benchmarks.training_client import start_exporter

    results: dict[str, Any] = {"width": width, "threads": threads, "every": every,
                               "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="ckpt-runs-") as tmp:
        workdir = Path(tmp)
        exporter, sock = start_exporter(workdir)
        try:
            for steps in lengths:
                runs: dict[str, list[dict[str, Any]]] = {"plain": [], "trainwatch": []}
                for i in range(rounds):
                    order = ("plain", "trainwatch") if i % 2 == 0 else ("trainwatch", "plain")
                    for mode in order:
                        # progress on stderr: a whole benchmark takes over ten minutes
                        print(f"[checkpoint runs] {steps} steps, round {i + 1}/{rounds}: {mode}",
                              file=sys.stderr, flush=True)
                        run_dir = workdir / f"{mode}-{steps}-{i}"
                        run_dir.mkdir()
                        done = subprocess.run(
                            [sys.executable, str(Path(__file__).resolve()), "--child", mode,
                             "--child-steps", str(steps), "--run-width", str(width),
                             "--threads", str(threads), "--every", str(every),
                             "--child-dir", str(run_dir), "--child-socket", str(sock)],
                            capture_output=True, text=True, timeout=3600, check=False)
                        if done.returncode != 0:
                            raise SystemExit(f"{mode} run failed: {done.stderr[-2000:]}")
                        runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
                results[f"steps_{steps}"] = _summarise_runs(runs)
        finally:
            exporter.terminate()
            exporter.wait(15)
    return results


def _summarise_runs(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    plain, tw = runs["plain"], runs["trainwatch"]

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    loop_over = [100 * (t["loop_s"] - p["loop_s"]) / p["loop_s"]
                 for p, t in zip(plain, tw, strict=True)]
    total_over = [100 * (t["loop_s"] + t["startup_s"] - p["loop_s"] - p["startup_s"])
                  / (p["loop_s"] + p["startup_s"]) for p, t in zip(plain, tw, strict=True)]
    first_ratio = [t["first_100_s"] / p["first_100_s"] for p, t in zip(plain, tw, strict=True)
                   if p["first_100_s"] and t["first_100_s"]]

    def paired_pct(key: str) -> list[float]:
        return [100 * (t[key] - p[key]) / p[key] for p, t in zip(plain, tw, strict=True)]

    walls = [r["loop_s"] for r in plain]
    plain_spread = 100 * (max(walls) - min(walls)) / min(walls) if len(walls) > 1 else None
    return {"plain_loop_s": round(med(plain, "loop_s"), 3),
            "trainwatch_loop_s": round(med(tw, "loop_s"), 3),
            "trainwatch_startup_s": round(med(tw, "startup_s"), 3),
            "loop_overhead_pct": round(statistics.median(loop_over), 2),
            "loop_overhead_pct_by_round": [round(x, 2) for x in loop_over],
            # the same run on the clocks a shared machine moves less (see run_child)
            "loop_overhead_unqueued_pct": round(statistics.median(
                paired_pct("loop_unqueued_s")), 2),
            "loop_overhead_unqueued_pct_by_round": [round(x, 2)
                                                    for x in paired_pct("loop_unqueued_s")],
            "loop_cpu_overhead_pct": round(statistics.median(paired_pct("loop_cpu_s")), 2),
            "loop_cpu_overhead_pct_by_round": [round(x, 2) for x in paired_pct("loop_cpu_s")],
            # how much the same plain run moved between rounds: the wall clock's noise here
            "plain_loop_spread_pct": None if plain_spread is None else round(plain_spread, 2),
            "startup_plus_loop_overhead_pct": round(statistics.median(total_over), 2),
            "first_100_steps_ratio": (round(statistics.median(first_ratio), 3)
                                      if first_ratio else None),
            "plain_first_100_s": round(med(plain, "first_100_s"), 3) if plain[0]["first_100_s"]
            else None,
            "trainwatch_first_100_s": round(med(tw, "first_100_s"), 3)
            if tw[0]["first_100_s"] else None,
            "failed_saves": sum(r.get("failed_saves", 0) for r in tw),
            "runs": runs}


def print_runs(runs: dict[str, Any]) -> None:
    print(f"whole runs ({runs['rounds']} rounds, layers {LAYERS} x {runs['width']}, torch on "
          f"{runs['threads']} thread(s), a save every {runs['every']} steps):")
    for key, fig in runs.items():
        if key.startswith("steps_"):
            print(f"  {key[6:]} steps: loop plain {fig['plain_loop_s']} s, Trainwatch "
                  f"{fig['trainwatch_loop_s']} s: overhead {fig['loop_overhead_pct']:+.2f} % "
                  f"(by round {fig['loop_overhead_pct_by_round']}; plain runs moved "
                  f"{fig['plain_loop_spread_pct']} % between rounds); without waits for a "
                  f"core {fig['loop_overhead_unqueued_pct']:+.2f} % "
                  f"(by round {fig['loop_overhead_unqueued_pct_by_round']}); CPU used "
                  f"{fig['loop_cpu_overhead_pct']:+.2f} % "
                  f"(by round {fig['loop_cpu_overhead_pct_by_round']}); start-up "
                  f"{fig['trainwatch_startup_s']} s (with it "
                  f"{fig['startup_plus_loop_overhead_pct']:+.2f} %); "
                  f"first 100 steps {fig['plain_first_100_s']} s vs "
                  f"{fig['trainwatch_first_100_s']} s ({fig['first_100_steps_ratio']}x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--writers", default=",".join(WRITERS),
                        help="asynchronous writers to measure in the loop, the first one "
                             "judged against the goal (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                        help="torch threads of the training loop (default: cores - 1, "
                             "leaving the writer the core a GPU host leaves it)")
    parser.add_argument("--runs", default="400,2000",
                        help="whole-run lengths in steps for part 3 ('' skips it)")
    parser.add_argument("--run-rounds", type=int, default=2)
    parser.add_argument("--run-width", type=int, default=WIDTH)
    parser.add_argument("--only", choices=("runs", "blocking"), default=None)
    parser.add_argument("--child", choices=("plain", "trainwatch"), help=argparse.SUPPRESS)
    parser.add_argument("--child-steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-dir", help=argparse.SUPPRESS)
    parser.add_argument("--child-socket", help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    if args.child:
        print(json.dumps(run_child(args.child, args.child_steps, args.run_width, args.threads,
                                   args.every, Path(args.child_dir), args.child_socket)))
        return 0
    lengths = [int(n) for n in args.runs.split(",") if n.strip()]
    if args.only == "runs":
        runs = bench_runs(lengths, args.run_rounds, args.run_width, args.threads, args.every)
        print_runs(runs)
        print(json.dumps({"benchmark": "checkpoint.runs", "machine": _machine(),
                          "runs": runs, "goals_met": run_goals(runs, lengths)}))
        return 0
    writers = [w for w in args.writers.split(",") if w]
    if not writers or any(w not in WRITERS for w in writers):
        parser.error(f"--writers takes a comma-separated list of {WRITERS}")
    torch.set_num_threads(args.threads)
    model, optimizer = build()
    train_step(model, optimizer, torch.randn(32, WIDTH))  # materialise the momentum
    size = state_bytes(model, optimizer)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-") as tmp:
        blocking = bench_blocking(Path(tmp), model, optimizer, args.saves)
        if args.only == "blocking":
            print(json.dumps({"benchmark": "checkpoint.blocking", "machine": _machine(),
                              "state_mb": round(size / 1e6, 1), "torch_threads": args.threads,
                              "loadavg_1m_before_after": [round(load_before[0], 2),
                                                          round(os.getloadavg()[0], 2)],
                              "blocking": blocking}))
            return 0
        loop = bench_loop(Path(tmp), model, optimizer, args.rounds, args.every, writers)
    runs = (bench_runs(lengths, args.run_rounds, args.run_width, args.threads, args.every)
            if lengths else None)
    judged = loop[f"on_{writers[0]}"]
    result = {
        "benchmark": "checkpoint", "machine": _machine(),
        "python": platform.python_version(), "torch": torch.__version__,
        "torch_threads": args.threads, "writers": writers,
        "state_mb": round(size / 1e6, 1), "blocking": blocking, "loop": loop, "runs": runs,
        "every": args.every,
        "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }
    result["goals_met"] = {
        "async_blocking_le_10pct_of_sync": blocking["async_over_sync_pct"] <= 10,
        "overhead_le_2pct": judged["wall_overhead_pct"] <= 2,
        "thread_cpu_overhead_le_2pct": judged["thread_cpu_overhead_pct"] <= 2,
        "blocking_le_2pct": judged["blocking_pct"] <= 2,
        # issue 28, point 10: the rule that chooses the save contract (informational)
        "on_save_within_10pct_of_sync": blocking["on_save_over_sync_pct"] <= 10,
        **(run_goals(runs, lengths) if runs else {})}
    print(f"state {result['state_mb']} MB: synchronous save blocks "
          f"{blocking['sync_blocking_s']:.3f} s, asynchronous {blocking['async_blocking_s']:.3f} s "
          f"({blocking['async_over_sync_pct']} % of synchronous; committed after "
          f"{blocking['async_until_committed_s']:.3f} s in the background); copying before "
          f"save() returns would block {blocking['on_save_blocking_s']:.3f} s "
          f"({blocking['on_save_over_sync_pct']} % of synchronous)")
    print(f"loop: {loop['step_ms_off']} ms/step without checkpoints (torch on {args.threads} "
          f"thread(s)), an asynchronous save every {args.every} steps (load average "
          f"{result['loadavg_1m_before_after']}); median of {loop['rounds']} paired ratios:")
    for clock in CLOCKS:
        print(f"  {clock:18} noise floor off vs off {loop[f'{clock}_noise_floor_pct']:+.2f} % "
              f"(quartiles {loop[f'{clock}_noise_quartiles_pct']})")
    for writer in writers:
        on = loop[f"on_{writer}"]
        print(f" {writer} writer: {on['step_ms']} ms/step, blocked in save() "
              f"{on['blocking_pct']} % of the time, off a core but not queued for one "
              f"{on['blocked_off_cpu_s']} s per chunk (without saves "
              f"{loop['blocked_off_cpu_s_off']} s), writer process "
              f"{on['writer_cpu_s_per_save']} CPU s per save")
        for clock in CLOCKS:
            print(f"  {clock:18} overhead {on[f'{clock}_overhead_pct']:+.2f} % "
                  f"(quartiles {on[f'{clock}_overhead_quartiles_pct']}, 90 % interval of the "
                  f"median {on[f'{clock}_overhead_median_ci90_pct']})")
    if runs:
        print_runs(runs)
    print(json.dumps(result))
    return 0


def _machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.machine()} {os.cpu_count()} cpus {model}".strip()


def run_goals(runs: dict[str, Any], lengths: list[int]) -> dict[str, bool]:
    """Issue 28, acceptance 4: the longest run's overhead (loop) <= 2 %, on the wall clock and
    without the waits for a core; and whether the wall clock could resolve 2 % at all here (the
    plain runs moved less than that between rounds)."""
    longest = runs[f"steps_{max(lengths)}"]
    return {"long_run_overhead_le_2pct": longest["loop_overhead_pct"] <= 2,
            "long_run_overhead_le_2pct_without_core_waits":
                longest["loop_overhead_unqueued_pct"] <= 2,
            "wall_clock_resolves_2pct": longest["plain_loop_spread_pct"] is not None
            and longest["plain_loop_spread_pct"] < 2}


if __name__ == "__main__":
    sys.exit(main())
