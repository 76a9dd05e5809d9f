"""Flush every live async handler at interpreter exit and on SIGTERM.

torchrun and Slurm stop ranks with SIGTERM; Python's default action for it kills the
process without running atexit, so records still queued would be lost. One module-level
hook serves all handlers and chains to whatever SIGTERM handler was there before.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref
from types import FrameType
from typing import Any, Protocol


class Flushable(Protocol):
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def disable_after_fork(self) -> None: ...


_live: weakref.WeakSet[Any] = weakref.WeakSet()
_install_lock = threading.Lock()
_state: dict[str, Any] = {"atexit": False, "sigterm": False, "previous": signal.SIG_DFL}


def register(handler: Flushable, *, sigterm: bool = True) -> None:
    """Track `handler`; install the atexit hook, and the SIGTERM hook when allowed."""
    _live.add(handler)
    with _install_lock:
        if not _state["atexit"]:
            atexit.register(_close_all)
            _state["atexit"] = True
        if sigterm and not _state["sigterm"] and _can_install_signal_handler():
            _state["previous"] = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _on_sigterm)
            _state["sigterm"] = True


def unregister(handler: Flushable) -> None:
    _live.discard(handler)


def _can_install_signal_handler() -> bool:
    """Signal handlers can only be set from the main thread of the main interpreter."""
    return threading.current_thread() is threading.main_thread()


def _after_fork_in_child() -> None:
    """A forked child has the handlers' queues and file buffers but not their writer threads:
    writing from there would duplicate or interleave the parent's lines, so the copies are
    disabled (their records are dropped and counted); the child makes its own handler."""
    for handler in list(_live):
        handler.disable_after_fork()
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _close_all() -> None:
    for handler in list(_live):
        handler.close()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Write what is queued, then do what SIGTERM would have done without us."""
    for handler in list(_live):
        handler.flush()
    previous = _state["previous"]
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # SIG_DFL or a handler installed from C: die of SIGTERM as the launcher expects
        for handler in list(_live):
            handler.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
