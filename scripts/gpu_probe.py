"""The GPU exporter's cost and readings on a real GPU, idle and under a bf16 matmul load.

    PYTHONPATH=. python3 scripts/gpu_probe.py          # on a host with an NVIDIA GPU and torch

What scripts/gpu_check.py does not measure: it starts `gpu-exporter --interval 1` on the real
driver and reports, for GPU 0, the scrape latency (p50, p99 of 300 back-to-back scrapes), the
exporter's CPU share of one core with one scrape per second (what Prometheus does) while the
GPU is idle and while it is busy, the collection cycle it exports
(trainwatch_gpu_exporter_collection_duration_seconds), and what the exporter reads idle and
while an 8192^3 bf16 matmul runs for 25 s in another process (utilization, power, SM clock,
temperature and the GPM ratios: tensor-core activity should read near 1), whether the NVML
event watch that the fast XID alerts ride on runs, and how many NVML calls failed. The
matmul's own TFLOP/s is printed beside them. Last line: a JSON object. Results:
docs/gpu_exporter.md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.gpu_check import Series, free_port, scrape, wait_for  # noqa: E402
from trainwatch.exporters.contract import catalog as c  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
READINGS = (c.GPU_UTILIZATION, c.GPU_POWER_USAGE, c.GPU_SM_CLOCK, c.GPU_TEMPERATURE,
            c.GPU_TENSOR_ACTIVE, c.GPU_SM_ACTIVE, c.GPU_DRAM_ACTIVE)
LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
began, n = time.time(), 0
while time.time() - began < 25:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    n += 20
print(2 * 8192**3 * n / (time.time() - began) / 1e12)
"""


def value(series: Series, name: str, gpu: str = "") -> float | None:
    """The sample `name` of GPU `gpu` (or the exporter's own, gpu ""), None when absent."""
    return next((v for n, labels, v in series
                 if n == name and labels.get("gpu", "") == gpu), None)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def readings(series: Series) -> dict[str, float | None]:
    """What GPU 0 read, of READINGS."""
    return {name: value(series, name, "0") for name in READINGS}


def cpu_share_while_scraped(url: str, pid: int, seconds: float) -> tuple[float, list[float]]:
    """The exporter's CPU share of one core with one scrape per second, and the collection
    cycle durations it exported meanwhile."""
    before, began, cycles = cpu_seconds(pid), time.monotonic(), []
    while time.monotonic() - began < seconds:
        cycles.append(value(scrape(url), c.GPU_EXPORTER_COLLECTION_DURATION) or 0.0)
        time.sleep(1)
    return (cpu_seconds(pid) - before) / (time.monotonic() - began), cycles


def main() -> int:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    exporter = subprocess.Popen(
        [sys.executable, "-m", "trainwatch.exporters.node.gpu.cli", "--bind", "127.0.0.1",
         "--port", str(port), "--interval", "1"], cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        if not wait_for("gpu-exporter", lambda: value(scrape(url), c.GPU_UP, "0") == 1, 30,
                        exporter):
            return 1
        time.sleep(3)  # GPM needs two cycles
        latencies = []
        for _ in range(300):
            began = time.perf_counter()
            scrape(url)
            latencies.append((time.perf_counter() - began) * 1000)
        latencies.sort()
        out: dict[str, object] = {"scrape_ms_p50": latencies[150],
                                  "scrape_ms_p99": latencies[296]}
        idle_share, cycles = cpu_share_while_scraped(url, exporter.pid, 15)
        health = scrape(url)
        out.update(cpu_share_idle=idle_share,
                   collection_cycle_ms_p50=statistics.median(cycles) * 1000,
                   idle=readings(health),
                   # the NVML event watch the fast XID alerts ride on, and NVML's errors
                   xid_watch_up=value(health, c.GPU_EXPORTER_XID_WATCH_UP),
                   nvml_errors=sum(v for n, _, v in health if n == c.GPU_EXPORTER_ERRORS))
        load = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True)
        time.sleep(12)  # clocks and power settle
        loaded_share, _ = cpu_share_while_scraped(url, exporter.pid, 8)
        out.update(cpu_share_loaded=loaded_share, loaded=readings(scrape(url)),
                   matmul_tflops=float(load.communicate(timeout=60)[0].strip()))
        print(json.dumps(out))
        return 0
    finally:
        exporter.terminate()
        exporter.wait(10)


if __name__ == "__main__":
    sys.exit(main())
