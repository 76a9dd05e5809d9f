"""Ports and polling for tests: tests never assume a fixed port, and never sleep to synchronise."""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


_issued: set[int] = set()
# Below this, no port is ever handed out as the source port of an outgoing connection
# (net.ipv4.ip_local_port_range starts at 32768 by default).
_FLOOR = 10000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_slice(low: int, high: int) -> range:
    """This pytest-xdist worker's share of [low, high): two workers never pick the same port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    try:
        count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    except ValueError:
        count = 1
    index = int(worker) % count if worker.isdigit() else 0
    width = (high - low) // count
    return range(low + index * width, low + (index + 1) * width)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    """The kernel's choice (bind to 0), never one this process gave out before."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _issued:
            _issued.add(port)
            return port


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for a server the test starts.

    Chosen below the kernel's ephemeral range, in this xdist worker's own slice of it: a port
    from the ephemeral range (bind to 0) can be taken as the source port of any outgoing
    connection on the machine between this call and the server's bind, which made torchrun's
    rendezvous fail with EADDRINUSE under a loaded suite. Ports already given out in this test
    process are never returned again, so two servers of one stack are never told to share one.
    A slice that is too small or used up falls back to the kernel's choice instead of looping.
    """
    candidates = _worker_slice(_FLOOR, _ephemeral_start())
    if len(candidates) >= 100:
        start = random.randrange(len(candidates))  # spreading, not secrecy
        for i in range(len(candidates)):  # each candidate once, from a random start
            port = candidates[(start + i) % len(candidates)]
            if port not in _issued and _bindable(port):
                _issued.add(port)
                return port
    return _kernel_port()


class Abort(Exception):
    """Raised by a predicate to stop waiting at once (say, the server exited)."""


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll `predicate` until it returns a truthy value or `timeout` passes.

    Exceptions raised by the predicate count as "not yet" (a server that is still starting
    refuses connections); the last one is reported if the deadline passes.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Abort:
            raise
        except Exception as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}{detail}")
        time.sleep(interval)
