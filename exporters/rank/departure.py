"""The last word of a rank that is being stopped: a SIGTERM watch that sends it.

When one rank of a job dies (SIGKILL, the OOM killer), torchrun's agent stops the others with
SIGTERM, usually before their collectives notice the loss. A Python process dies of SIGTERM
at once, without atexit, so without this the others' heartbeats simply stop a moment after
the killed rank's, and nothing outside can tell which one went first. With it, each rank
that torchrun (or Slurm, or anything else) stops says so in a last datagram (`exiting`), and
the rank that said nothing is the one that was killed (alert_rules/training.py
STOPPED_FIRST).

How, without keeping the process alive a moment longer than it would have been: a Python
signal handler alone runs only when the main thread returns to the interpreter, which a rank
blocked in a collective never does. So the handler is installed together with a wakeup fd
(`signal.set_wakeup_fd`): Python's C-level handler writes the signal number there at once,
from whichever thread the kernel picked, and a small thread reading it sends the last
datagram, restores the default action (through libc: signal.signal works only on the main
thread) and sends SIGTERM again, so the process still dies of SIGTERM (exit status -15).

It is installed only where it changes nothing else: on the main thread, while SIGTERM has its
default action and no wakeup fd is set (a script's own SIGTERM handler, or asyncio's wakeup
fd, win; the rank then ends as it did before), and it stands aside when a handler installed
later replaces it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
_lock = threading.Lock()
_installed: list[Callable[[], None]] = []  # what to run on SIGTERM (the monitors' goodbyes)


def on_terminate(goodbye: Callable[[], None]) -> bool:
    """Run `goodbye` (quickly: the process dies right after) when SIGTERM arrives; False when
    the watch cannot be installed here (not the main thread, or SIGTERM already handled)."""
    with _lock:
        if _installed:
            _installed.append(goodbye)
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return False
            reader, writer = socket.socketpair()
            reader.setblocking(True)
            writer.setblocking(False)
            previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
            if previous != -1:  # someone else's wakeup fd: leave it alone
                signal.set_wakeup_fd(previous)
                reader.close()
                writer.close()
                return False
            signal.signal(signal.SIGTERM, _handler)
        except (ValueError, OSError) as exc:
            log.debug("no SIGTERM watch: %s", exc)
            return False
        _installed.append(goodbye)
        threading.Thread(target=_watch, args=(reader, writer), name="trainwatch-sigterm",
                         daemon=True).start()
        os.register_at_fork(after_in_child=_forget_in_child)
        return True


def _forget_in_child() -> None:
    """A forked child (a DataLoader worker, which the DataLoader may stop with SIGTERM) must
    not inherit the watch: its Python handler would write to the wakeup fd it shares with the
    parent, whose watcher would take the child's SIGTERM for its own and end the rank. The
    child gets the default action back and no wakeup fd; it has no monitor of its own."""
    _installed.clear()
    try:
        if signal.getsignal(signal.SIGTERM) is _handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        pass


def _handler(signum: int, frame: Any) -> None:  # the main thread, when it gets to run it
    _terminate()


def _watch(reader: socket.socket, writer: socket.socket) -> None:
    """Read signal numbers Python's C handler wrote; act on SIGTERM."""
    while True:
        try:
            data = reader.recv(64)
        except OSError:
            return
        if not data:
            return
        # only while the handler is still ours: a SIGTERM handler the script (or a framework:
        # Lightning saves a checkpoint on SIGTERM) installed later decides what happens
        if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) is _handler:
            _terminate()


_terminating = threading.Lock()


def _terminate() -> None:
    """Say goodbye once, then die of SIGTERM as the default action would have."""
    if not _terminating.acquire(blocking=False):
        return  # the other thread is on it
    for goodbye in list(_installed):
        try:
            goodbye()
        except Exception:  # dying anyway: never let a goodbye keep the process alive
            log.debug("goodbye failed", exc_info=True)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal(signal.SIGTERM, ctypes.c_void_p(0))  # SIG_DFL, from any thread
    os.kill(os.getpid(), signal.SIGTERM)
