"""The chaos soak's `socket_cut` (benchmarks/chaos_infra_faults.py) on a real 2-rank gloo job
under torchrun: it finds the one gloo connection between the ranks, not the TCPStore's, and
`ss -K` of it fails both ranks' collective at once (no hang for the stall playbooks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from benchmarks.chaos_infra_faults import abort, gloo_connections
from tests.support.net import free_port, wait_until

WORKER = '''
import json, os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
out = sys.argv[1]
def say(**fields):
    with open(out, "a") as f:
        f.write(json.dumps({"rank": dist.get_rank(), **fields}) + "\\n")
t = torch.ones(4)
dist.all_reduce(t)
say(pid=os.getpid())
try:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        dist.all_reduce(t)
        time.sleep(0.05)
except Exception as exc:
    say(failed=time.time(), error=str(exc)[:300])
    sys.exit(1)
'''


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.skipif(os.geteuid() != 0, reason="ss -K (SOCK_DESTROY) needs CAP_NET_ADMIN")
def test_the_gloo_pair_is_found_and_cutting_it_fails_both_ranks(tmp_path: Path) -> None:
    worker, out = tmp_path / "worker.py", tmp_path / "events.jsonl"
    worker.write_text(WORKER)
    with (tmp_path / "torchrun.log").open("w") as log:
        job = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(worker),
             str(out)], stdout=subprocess.DEVNULL, stderr=log,
            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        pids = wait_until(lambda: (lambda p: p if len(p) == 2 else None)(
            {e["rank"]: e["pid"] for e in _lines(out) if "pid" in e}), timeout=120,
            what="both ranks up")
        rank1 = psutil.Process(int(pids[1]))
        store = int(rank1.environ()["MASTER_PORT"])
        pairs = gloo_connections(int(pids[1]), int(pids[0]))
        # one process group, one pair: the connection to the TCPStore (torchrun's agent)
        # is not among them, though rank 1 holds one
        assert len(pairs) == 1, pairs
        assert any(c.raddr and c.raddr.port == store
                   for c in rank1.net_connections(kind="tcp"))
        assert store not in pairs[0]
        peer_ports = {c.laddr.port for c in psutil.Process(int(pids[0])).net_connections(
            kind="tcp")}
        assert pairs[0][1] in peer_ports
        abort(pairs)
        failed = wait_until(lambda: (lambda f: f if len(f) == 2 else None)(
            [e for e in _lines(out) if "failed" in e]), timeout=30, what="both ranks failed")
        errors = " | ".join(str(e["error"]) for e in failed)
        assert "connection abort" in errors and "reset by peer" in errors, errors
        assert job.wait(timeout=60) != 0
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
