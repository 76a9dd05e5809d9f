"""A real training exporter in a child process for the benchmarks that report to one.

Its own module so that the benchmarks that start an exporter (training_client, checkpoint,
goodput) share it without importing each other.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path


def start_exporter(workdir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Start `training-exporter` on a free loopback port with its report socket in `workdir`;
    the process and the socket path once the socket exists (the caller stops the process)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sock = workdir / "bench.sock"
    exe = Path(sys.executable).parent / "training-exporter"
    proc = subprocess.Popen([str(exe), "--bind", "127.0.0.1", "--port", str(port), "--socket",
                             str(sock), "--node", "bench"], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not sock.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            proc.wait()
            raise SystemExit("training-exporter did not start")
        time.sleep(0.05)
    return proc, sock
