"""Benchmark: gpu-exporter (8 simulated GPUs, 1 s interval, GPM on) against a naive exporter.

    .venv/bin/python benchmarks/gpu_exporter.py [--scrapes 300] [--window 15] [--cycles 30]

Both exporters run as real processes on loopback and read the same fake NVML (no GPU here):
- trainwatch: the shipped `gpu-exporter --simulate 8 --interval 1` (background snapshot,
  its own exposition text and process metrics, no prometheus_client);
- baseline: the naive shape the issue calls out: NVML is read inside each scrape, served from
  prometheus_client's default registry (process, gc and platform collectors included).

Measured per exporter: scrape latency p50/p99 over back-to-back HTTP scrapes; CPU share of one
core from /proc/<pid>/stat over a window with one scrape per second (what Prometheus does),
and for trainwatch also with no scrapes at all (pure collection); RSS (VmRSS). With the fake,
an NVML call costs only Python time; on a real GPU each call also waits on the driver, which
the baseline's scrape pays and trainwatch's does not. Last line: a JSON object.

Also measured, in the same run:
- collection cycle time for 8 GPUs with and without GPM, in process: once on the bare fake
  (the exporter's own Python cost) and once with the fake sleeping each call's latency as
  measured on the H100 (fake_nvml.H100_CALL_LATENCY_MS: a model of the real driver's cycle;
  its 1-GPU cycle without GPM is checked against the 4.5 ms measured there);
- the exporter's own RSS: its VmRSS minus a floor process's (the same interpreter after
  `import pynvml` and an nvmlInit attempt, where the H100 host measured 50.5 of 56.9 MiB).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
GOALS = {"scrape_p99_ms": 10.0, "cpu_share_of_core": 0.02, "own_rss_mib": 10.0}
FLOOR_SCRIPT = """
import signal, sys
import pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError:
    pass  # no driver on this machine: the floor is the interpreter and the module
print("ready", flush=True)
signal.sigwait({signal.SIGTERM, signal.SIGINT})
"""


def uss_mib(pid: int) -> float:
    """Private (unshared) resident memory: what the process alone adds to the machine."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return total / 1024


def floor_rss_mib() -> tuple[float, float]:
    """(VmRSS, USS) of the interpreter + pynvml (+ nvmlInit where a driver exists)."""
    proc = subprocess.Popen([sys.executable, "-c", FLOOR_SCRIPT], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        return rss_mib(proc.pid), uss_mib(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


def cycle_ms(gpus: int, gpm: bool, latency: bool, cycles: int) -> float:
    """Median wall time of one collection cycle, in process (no HTTP)."""
    from trainwatch.exporters.node.gpu.collector_loop import CollectionLoop
    from trainwatch.exporters.node.gpu.fake_nvml import (
        H100_CALL_LATENCY_MS,
        FakeNvml,
        simulated_scenario,
    )
    from trainwatch.exporters.node.gpu.processes import ProcessAttributor

    scenario = simulated_scenario(gpus, dynamic=False)
    if latency:
        scenario["latency_ms"] = dict(H100_CALL_LATENCY_MS)
    fake = FakeNvml(scenario)
    loop = CollectionLoop(fake, interval=1.0, attributor=ProcessAttributor(fake.process_environ),
                          watch_xid=False, read_gpm=gpm)
    loop.run_once()  # init, identities, first GPM sample
    times = []
    for _ in range(cycles):
        started = time.perf_counter()
        loop.run_once()
        times.append((time.perf_counter() - started) * 1000)
    loop.stop()
    return statistics.median(times)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_baseline(port: int, gpus: int) -> None:
    """The naive exporter: a collect() that runs a full NVML cycle per scrape."""
    from prometheus_client import REGISTRY, start_http_server

    from trainwatch.exporters.node.gpu.collector_loop import CollectionLoop
    from trainwatch.exporters.node.gpu.exposition import snapshot_families
    from trainwatch.exporters.node.gpu.fake_nvml import FakeNvml, simulated_scenario
    from trainwatch.exporters.node.gpu.processes import ProcessAttributor

    fake = FakeNvml(simulated_scenario(gpus))
    loop = CollectionLoop(fake, interval=1.0, attributor=ProcessAttributor(fake.process_environ),
                          watch_xid=False)

    class ScrapeTimeCollector:
        def collect(self):  # type: ignore[no-untyped-def] - prometheus_client protocol
            yield from snapshot_families(loop.run_once())

    REGISTRY.register(ScrapeTimeCollector())
    start_http_server(port, addr="127.0.0.1")
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


def scrape_ms(port: int) -> float:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200 and b"trainwatch_gpu_up" in body
    finally:
        conn.close()
    return (time.perf_counter() - started) * 1000


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_share(pid: int, port: int, window: float, scrape_every: float | None) -> float:
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    while (elapsed := time.monotonic() - start) < window:
        if scrape_every:
            scrape_ms(port)
        time.sleep(min(scrape_every or window, max(window - elapsed, 0.0)))
    return (cpu_seconds(pid) - start_cpu) / (time.monotonic() - start)


def wait_ready(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exporter exited with {proc.returncode}")
        try:
            scrape_ms(port)
            return
        except (OSError, AssertionError):
            time.sleep(0.1)
    raise RuntimeError("exporter did not become ready")


def measure(argv: list[str], port: int, scrapes: int, window: float,
            idle_window: bool) -> dict[str, float]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_ready(port, proc)
        time.sleep(2.0)  # a couple of collection cycles before measuring
        latencies = sorted(scrape_ms(port) for _ in range(scrapes))
        result = {
            "scrape_p50_ms": statistics.median(latencies),
            "scrape_p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
            "cpu_share_of_core_1hz_scrapes": cpu_share(proc.pid, port, window, 1.0),
        }
        if idle_window:
            result["cpu_share_of_core_collect_only"] = cpu_share(proc.pid, port, window, None)
        result["rss_mib"] = rss_mib(proc.pid)
        result["uss_mib"] = uss_mib(proc.pid)
        return result
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--window", type=float, default=15.0, help="CPU window, seconds")
    parser.add_argument("--cycles", type=int, default=30, help="cycles per cycle-time case")
    parser.add_argument("--serve-baseline", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_baseline:
        serve_baseline(args.serve_baseline, args.gpus)
        return 0

    cycles = {
        f"{'gpm' if gpm else 'no_gpm'}_{'h100_latency' if latency else 'bare_fake'}_ms":
            cycle_ms(args.gpus, gpm, latency, args.cycles)
        for latency in (False, True) for gpm in (False, True)}
    one_gpu_modelled = cycle_ms(1, False, True, args.cycles)
    floor, floor_uss = floor_rss_mib()
    port = free_port()
    ours = measure([str(VENV_BIN / "gpu-exporter"), "--bind", "127.0.0.1", "--port", str(port),
                    "--interval", "1", "--simulate", str(args.gpus)],
                   port, args.scrapes, args.window, idle_window=True)
    port = free_port()
    base = measure([sys.executable, __file__, "--serve-baseline", str(port),
                    "--gpus", str(args.gpus)], port, args.scrapes, args.window, idle_window=False)

    ratios = {key: round(base[key] / ours[key], 2) if ours[key] else None
              for key in ("scrape_p50_ms", "scrape_p99_ms", "cpu_share_of_core_1hz_scrapes",
                          "rss_mib", "uss_mib")}
    own_rss = ours["rss_mib"] - floor
    own_uss = ours["uss_mib"] - floor_uss
    goals = {
        "scrape_p99_ms<=10": ours["scrape_p99_ms"] <= GOALS["scrape_p99_ms"],
        "cpu_share_of_core<=0.02": ours["cpu_share_of_core_1hz_scrapes"]
        <= GOALS["cpu_share_of_core"],
        "own_rss_mib<=10": own_rss <= GOALS["own_rss_mib"],
    }
    for name, data in (("trainwatch", ours), ("baseline (NVML in scrape)", base)):
        print(f"{name:28s} " + "  ".join(f"{k}={v:.4g}" for k, v in data.items()))
    print("baseline/trainwatch ratios: " + "  ".join(f"{k}={v}" for k, v in ratios.items()))
    print(f"cycle time, {args.gpus} GPUs (median of {args.cycles}): "
          + "  ".join(f"{k}={v:.2f}" for k, v in cycles.items()))
    print(f"GPM adds {cycles['gpm_bare_fake_ms'] - cycles['no_gpm_bare_fake_ms']:.2f} ms of "
          f"exporter time per cycle; modelled on the H100's call latencies "
          f"{cycles['gpm_h100_latency_ms'] / cycles['no_gpm_h100_latency_ms']:.2f}x the cycle "
          f"(1 GPU without GPM modelled {one_gpu_modelled:.2f} ms, measured there 4.5 ms)")
    print(f"RSS: exporter {ours['rss_mib']:.1f} MiB, floor (python + pynvml) {floor:.1f} MiB, "
          f"own share {own_rss:.1f} MiB (private memory: exporter {ours['uss_mib']:.1f}, floor "
          f"{floor_uss:.1f}, own share {own_uss:.1f} MiB)")
    print("goals met: " + "  ".join(f"{k}: {v}" for k, v in goals.items()))
    print(json.dumps({
        "benchmark": "gpu_exporter", "gpus": args.gpus, "interval_s": 1.0,
        "scrapes": args.scrapes, "cpu_window_s": args.window,
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}",
        "trainwatch": {k: round(v, 4) for k, v in ours.items()},
        "baseline": {k: round(v, 4) for k, v in base.items()},
        "ratios_baseline_over_trainwatch": ratios, "goals_met": goals,
        "cycle_ms": {k: round(v, 3) for k, v in cycles.items()},
        "one_gpu_no_gpm_h100_latency_ms": round(one_gpu_modelled, 3),
        "rss_floor_mib": round(floor, 2), "own_rss_mib": round(own_rss, 2),
        "uss_floor_mib": round(floor_uss, 2), "own_uss_mib": round(own_uss, 2),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
