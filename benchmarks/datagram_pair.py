"""The training exporters of two trees fed in alternation: the exporter's CPU per datagram.

    PYTHONPATH=$PWD python benchmarks/datagram_pair.py --exporter base=BIN:TREE
                                        --exporter new=BIN:TREE [--pairs 2] [--datagrams 20000]

compare_trees' probe for the exporter's intake (issue 39: every datagram's sender is looked
up from its kernel credentials and checked against its job's identity). Each pair starts both
trees' `training-exporter` (BIN is the tree's console script, run with PYTHONPATH=TREE) at
once, warms each up, then sends them `--datagrams` datagrams each in turn, one to each: the
datagrams of an 8-rank job at 10 ms steps (20 steps per datagram, as a rank's shipper sends
them every 0.2 s), from this one process. CPU per datagram is the exporter's own
(/proc/<pid>/stat, utime + stime) from before the first datagram until its datagram counter
(/metrics) shows every one of them taken (a few scrapes at the end, the same on both sides).
Prints the median over the pairs per tree; last line JSON. Standard library plus
benchmarks/gpu_exporter.py's helpers (no Trainwatch import: the wire is JSON, version 1 in
every tree compared).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.gpu_exporter import cpu_seconds, free_port
from benchmarks.scrape_pair import parse_exporter

RANKS = 8
STEPS_PER_DATAGRAM = 20
WARM_UP_DATAGRAMS = 2000
_COUNTER = re.compile(rb"^trainwatch_training_exporter_datagrams_total(?:\{[^}]*\})? (\S+)$",
                      re.M)
_MALFORMED = re.compile(
    rb"^trainwatch_training_exporter_malformed_datagrams_total(?:\{[^}]*\})? (\S+)$", re.M)


def start(binary: Path, tree: Path, workdir: Path) -> tuple[subprocess.Popen, int, str]:
    port = free_port()
    sock = workdir / "bench.sock"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.Popen([str(binary), "--bind", "127.0.0.1", "--port", str(port),
                             "--socket", str(sock), "--node", "bench"], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 30
    while not sock.exists() or counters(port) is None:
        if time.monotonic() > deadline or proc.poll() is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            raise SystemExit(f"{binary} did not start")
        time.sleep(0.05)
    return proc, port, str(sock)


def counters(port: int) -> tuple[float, float] | None:
    """(datagrams, malformed) as the exporter counts them; None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            page = resp.read()
    except OSError:
        return None
    taken, bad = _COUNTER.search(page), _MALFORMED.search(page)
    return (float(taken.group(1)) if taken else 0.0, float(bad.group(1)) if bad else 0.0)


def datagrams(count: int, first_step: int) -> list[bytes]:
    """`count` datagrams of the 8 ranks in turn, each with the next 20 steps of its rank."""
    out = []
    now = time.time()
    for i in range(count):
        rank = i % RANKS
        step0 = first_step + (i // RANKS) * STEPS_PER_DATAGRAM
        steps = [[s, now + s * 0.01, 0.01, 2.0 + 1.0 / (s + 1), 1e-3, 0.5, 0.0005]
                 for s in range(step0, step0 + STEPS_PER_DATAGRAM)]
        out.append(json.dumps({"v": 1, "job": "bench", "rank": rank, "local_rank": rank,
                               "world_size": RANKS, "restarts": 0, "incarnation": "b3e1c4",
                               "steps": steps}, separators=(",", ":")).encode())
    return out


def drained(port: int, expected: float, deadline_s: float = 120.0) -> tuple[float, float]:
    deadline = time.monotonic() + deadline_s
    while True:
        seen = counters(port)
        if seen is not None and seen[0] >= expected:
            return seen
        if time.monotonic() > deadline:
            raise SystemExit(f"exporter on {port} took {seen} of {expected} datagrams")
        time.sleep(0.02)


def one_pair(exporters: dict[str, tuple[Path, Path]], count: int) -> dict[str, float]:
    """name -> exporter CPU microseconds per datagram, both exporters alive and alternated."""
    running: dict[str, tuple[subprocess.Popen, int, str]] = {}
    with tempfile.TemporaryDirectory(prefix="datagram-pair-") as tmp, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        try:
            for name, (binary, tree) in exporters.items():
                workdir = Path(tmp) / name
                workdir.mkdir()
                running[name] = start(binary, tree, workdir)
            warm = datagrams(WARM_UP_DATAGRAMS, 0)
            for _, port, path in running.values():
                for data in warm:
                    sender.sendto(data, path)
                drained(port, WARM_UP_DATAGRAMS)
            payload = datagrams(count, WARM_UP_DATAGRAMS // RANKS * STEPS_PER_DATAGRAM)
            cpu_before = {name: cpu_seconds(proc.pid) for name, (proc, _, _) in running.items()}
            order = list(running)
            for i, data in enumerate(payload):
                for name in order if i % 2 == 0 else reversed(order):
                    sender.sendto(data, running[name][2])
            result = {}
            for name, (proc, port, _) in running.items():
                _, bad = drained(port, WARM_UP_DATAGRAMS + count)
                if bad:
                    raise SystemExit(f"{name}: {bad:.0f} datagrams counted malformed")
                result[name] = (cpu_seconds(proc.pid) - cpu_before[name]) * 1e6 / count
            return result
        finally:
            for proc, _, _ in running.values():
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exporter", type=parse_exporter, action="append", required=True)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--datagrams", type=int, default=20000,
                        help="per exporter and pair (CPU is counted in 1/CLK_TCK s ticks)")
    args = parser.parse_args()
    exporters = dict(args.exporter)
    pairs = [one_pair(exporters, args.datagrams) for _ in range(args.pairs)]
    result = {name: {"cpu_us_per_datagram": round(statistics.median(p[name] for p in pairs), 3),
                     "by_pair": [round(p[name], 3) for p in pairs]}
              for name in exporters}
    for name, figures in result.items():
        print(f"{name:8s} CPU {figures['cpu_us_per_datagram']:.2f} us per datagram "
              f"(pairs {figures['by_pair']})")
    print(json.dumps({"benchmark": "datagram_pair", "pairs": args.pairs,
                      "datagrams": args.datagrams, "exporters": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
