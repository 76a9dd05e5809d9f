"""Ports and polling for tests: tests never assume a fixed port, and never sleep to synchronise."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


_issued: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to 0, read it back).

    The kernel may hand the same ephemeral port to two binds in a row once the first socket
    is closed, so ports already given out in this test process are never returned again:
    otherwise two servers of one stack could be told to share a port, and a readiness probe
    would be answered by the wrong one.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _issued:
            _issued.add(port)
            return port


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
