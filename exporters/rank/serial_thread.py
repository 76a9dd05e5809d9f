"""One long-lived daemon thread that runs submitted calls in order and hands back futures.

Why not a thread per call: starting a thread makes the caller wait until the new thread has
run its first Python (it needs the GIL, which the training process's other threads hold in
turns): about a millisecond of the training thread at every asynchronous save, measured in
`benchmarks/checkpoint.py --only runs`. Why not `concurrent.futures.ThreadPoolExecutor`: its
worker is joined at interpreter exit, so a process whose peers died, with a commit blocked
in a collective, could never exit; this thread is a daemon, as the per-save thread was.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class SerialThread:
    """Runs `submit`ted calls one after the other on a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: _Calls = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the thread now (before training), so that no later call pays for it. Also
        after a fork, where the parent's thread does not exist in the child."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=_run, args=(self._queue,),
                                                name=self._name, daemon=True)
                self._thread.start()

    def submit(self, call: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.start()
        with self._lock:
            self._queue.put((future, call, args))
        return future

    def close(self) -> None:
        """Let the thread end once the calls submitted so far ran (it does not wait)."""
        with self._lock:
            self._queue.put(None)
            # a thread started later gets a queue of its own: two never take the same calls
            self._queue = queue.SimpleQueue()
            self._thread = None


_Calls = queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None]


def _run(calls: _Calls) -> None:
    while (item := calls.get()) is not None:
        _call(*item)
        del item  # holds the call (a manager's bound method) while the queue is empty


def _call(future: Future[Any], call: Callable[..., Any], args: tuple[Any, ...]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(call(*args))
    except BaseException as exc:  # handed to whoever waits on the future
        future.set_exception(exc)
