"""Writes checkpoint shards in a process of its own, so the training process does not pay for it.

Why a process: writing a rank's part of a checkpoint (serialising every tensor with
torch.save into the shard file, computing its checksums, write, fsync) costs about 0.5 s
of a core per 200 MB, much of it holding the GIL. On a thread of the training process that
time is taken from the training thread (GIL hand-offs between every op it dispatches) and
from the training process's cores. Here the training process keeps only the cheap parts of
a DCP save (planning, its collectives, the commit) and hands the heavy part, the storage
writer's `write_data`, to a writer process:

  * the staged copy of the state lives in shared memory (DCP's DefaultStager with
    `use_shared_memory`), and the stager reuses it at every save; each shared storage is
    passed to the writer once, as a file descriptor over a Unix socket (SCM_RIGHTS), and
    afterwards a save only sends where each tensor lies in it (a few bytes per tensor);
  * the writer runs DCP's own FileSystemWriter.write_data on those tensors, so the files and
    the write results are exactly those of an in-process save;
  * it runs at the lowest priority (nice 19; SCHED_IDLE with `idle=True`) from its first
    instruction, its start-up included (importing torch costs seconds of a core), so it
    takes next to no CPU time the training process and its data loaders want (a nice-19
    process beside a nice-0 one on a core gets 15/1039 of it); the checkpoint manager
    waits for it to be ready (warm) before the first step, so that start-up never overlaps
    training (issue 28: it made a short run's first 100 steps 1.9x slower). Where training
    keeps every core busy, a write proceeds in the training process's idle moments, and at
    worst the next save waits for it, as a synchronous save would;
  * it exits when the training process dies (a watchdog on its parent pid; a `kill -9` of a
    rank leaves no writer behind) and the training process starts a new one when its writer
    died (that save fails and is reported; the next one works).

The writer is started with `python -m trainwatch.exporters.rank.checkpoint_writer` (not
multiprocessing's spawn, which re-imports the training script as `__mp_main__`), with an
environment of only what it needs to import this package: none of the training job's
secrets. One writer serves every CheckpointManager of a process.
"""

from __future__ import annotations

import atexit
import io
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the writer imports torch only once it runs at idle priority (main)
    import torch

# The lowest priority: the writer (its start-up included) runs on CPU time the training
# process and its data loaders leave unused. Nice 19 rather than SCHED_IDLE by default: on a
# host whose every core is busy (a shared test machine) SCHED_IDLE's weight of 3 against
# nice 19's 15 can stall the writer's start-up and writes for tens of seconds, which the
# next save would then wait for.
WRITER_NICE = 19
READY_TIMEOUT_S = 600.0  # importing torch on a loaded host can take a minute
_HEADER = struct.Struct("!QI")  # payload length, number of file descriptors
_MAX_FDS = 253  # SCM_RIGHTS limit per message on Linux
_PARENT_POLL_S = 0.5


class WriterError(RuntimeError):
    """The writer process failed to write a shard, or died."""


# --- framing: pickled payload, file descriptors alongside the header --------------------------
def _send(sock: socket.socket, message: Any, fds: list[int] | None = None) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    fds = fds or []
    for start in range(0, max(len(fds), 1), _MAX_FDS):
        chunk = fds[start:start + _MAX_FDS]
        if start + _MAX_FDS < len(fds):  # more descriptors follow: an empty payload carries them
            socket.send_fds(sock, [_HEADER.pack(0, len(chunk))], chunk)
        else:
            socket.send_fds(sock, [_HEADER.pack(len(payload), len(chunk))], chunk)
    sock.sendall(payload)


def _recv_exact(sock: socket.socket, size: int, into: bytearray) -> None:
    while len(into) < size:
        part = sock.recv(min(size - len(into), 1 << 20))
        if not part:
            raise EOFError("writer connection closed")
        into.extend(part)


def _recv(sock: socket.socket) -> tuple[Any, list[int]]:
    fds: list[int] = []
    while True:
        head, got, _flags, _addr = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
        if not head:
            raise EOFError("writer connection closed")
        fds.extend(got)
        buffer = bytearray(head)
        _recv_exact(sock, _HEADER.size, buffer)
        size, _count = _HEADER.unpack(bytes(buffer))
        if size:
            break
        # size 0: only descriptors in this frame, unless the payload itself is empty (never:
        # a pickle is at least a few bytes)
    payload = bytearray()
    _recv_exact(sock, size, payload)
    # A socketpair between the training process and its own child: no one else can write it.
    return pickle.loads(bytes(payload)), fds  # noqa: S301


# --- parent side ------------------------------------------------------------------------------
def _child_env() -> dict[str, str]:
    """What the writer needs to import this package and torch, nothing else (no tokens)."""
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    for name in ("PATH", "LANG", "LC_ALL", "TMPDIR", "HOME"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


class WriterProcess:
    """Client of one writer process; thread-safe (one request at a time)."""

    def __init__(self, nice: int = WRITER_NICE, idle: bool = False) -> None:
        self._nice = nice
        self._idle = idle
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._ready = False
        self._sent: dict[int, torch.UntypedStorage] = {}  # held: its address stays its own
        self._owners: dict[int, set[int]] = {}
        self.starts = 0
        self._start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(child.fileno()), str(os.getpid()),
                 str(self._nice), "idle" if self._idle else "nice"],
                pass_fds=[child.fileno()], env=_child_env(), stdin=subprocess.DEVNULL)
        finally:
            child.close()
        # At once, from here too: the child sets it again first thing, but the interpreter's
        # own start-up runs before that.
        lower_priority(self._proc.pid, self._nice, self._idle)
        self._sock, self._ready = parent, False
        self._sent.clear()
        self.starts += 1

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc = None
        self._sent.clear()

    def ensure_ready(self) -> None:
        """Start the writer if it died and wait until it has imported what it needs (its
        start-up, at idle priority); the checkpoint manager calls this before training
        starts. Raises WriterError."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._stop()
                self._start()
            try:
                self._await_ready()
            except (OSError, EOFError, pickle.PickleError) as exc:
                self._stop()
                raise WriterError(f"checkpoint writer process did not start: "
                                  f"{type(exc).__name__}: {exc}") from exc

    def _await_ready(self) -> None:
        if self._ready:
            return
        assert self._sock is not None
        self._sock.settimeout(READY_TIMEOUT_S)
        try:
            message, _ = _recv(self._sock)
        finally:
            self._sock.settimeout(None)
        if message != ("ready",):
            raise WriterError(f"writer process answered {message!r} instead of ready")
        self._ready = True

    def write(self, owner: int, path: str, plan: Any, items: Mapping[Any, Any],
              options: dict[str, Any]) -> list[Any]:
        """Write `items` (write-item index -> tensor or BytesIO, as the planner resolved them)
        of `plan` under `path`; returns DCP's WriteResults. Raises WriterError."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._stop()
                self._start()  # the last one died: that save failed, this one gets a new one
            try:
                self._await_ready()
                return self._request(owner, path, plan, items, options)
            except (OSError, EOFError, pickle.PickleError) as exc:
                self._stop()
                raise WriterError(f"checkpoint writer process failed: "
                                  f"{type(exc).__name__}: {exc}") from exc

    def _request(self, owner: int, path: str, plan: Any, items: Mapping[Any, Any],
                 options: dict[str, Any]) -> list[Any]:
        assert self._sock is not None
        described: dict[Any, tuple[Any, ...]] = {}
        new_keys: list[tuple[int, int]] = []
        fds: list[int] = []
        mine: set[int] = set()
        for index, data in items.items():
            if isinstance(data, io.BytesIO):
                described[index] = ("bytes", data.getvalue())
                continue
            storage = data.untyped_storage()
            key = storage.data_ptr()
            if not key or not storage.is_shared():
                described[index] = ("value", data.contiguous())  # pickled by value
                continue
            if key not in self._sent:
                fd, size = storage._share_fd_cpu_()
                new_keys.append((key, size))
                fds.append(fd)
                self._sent[key] = storage
            mine.add(key)
            described[index] = ("shared", key, data.storage_offset(), tuple(data.shape),
                                tuple(data.stride()), data.dtype)
        self._owners[owner] = mine
        keep = self._prune()
        _send(self._sock, ("write", path, plan, new_keys, keep, described, options), fds)
        reply, _ = _recv(self._sock)
        if reply[0] != "ok":
            raise WriterError(reply[1])
        return reply[1]

    def _prune(self) -> set[int]:
        """Drop the storages no owner stages into any more; returns those kept."""
        keep: set[int] = set().union(*self._owners.values())
        for key in [k for k in self._sent if k not in keep]:
            del self._sent[key]
        return keep

    def release(self, owner: int) -> None:
        """Forget an owner's staged storages (its manager closed), here and in the writer,
        so their shared memory is freed."""
        with self._lock:
            if self._owners.pop(owner, None) is None:
                return
            keep = self._prune()
            if self._sock is None or not self._ready:
                return
            try:
                _send(self._sock, ("keep", keep))
                _recv(self._sock)
            except (OSError, EOFError):
                self._stop()

    def close(self) -> None:
        with self._lock:
            if self._sock is not None and self._proc is not None and self._proc.poll() is None:
                try:
                    _send(self._sock, ("close",))
                    self._proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._stop()


_shared: WriterProcess | None = None
_shared_lock = threading.Lock()


def shared_writer() -> WriterProcess:
    """The process's writer, started on first use (it imports torch meanwhile)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = WriterProcess()
            atexit.register(_shared.close)
        return _shared


def shared_writer_pid() -> int | None:
    """The pid of the process's writer, if one was started (for accounting its CPU time)."""
    return _shared.pid if _shared is not None else None


def lower_priority(pid: int, nice: int, idle: bool) -> str:
    """Put process `pid` (0: this one) at the lowest priority: SCHED_IDLE where the OS has
    it and `idle`, else nice `nice` (lowering never needs privileges). Returns what was set;
    an OS that refuses both leaves the priority as it is (the writer still works, only less
    politely)."""
    if idle and hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
            return "SCHED_IDLE"
        except OSError:
            pass
    try:
        current = os.getpriority(os.PRIO_PROCESS, pid)
        if current < nice:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
        return f"nice {max(current, nice)}"
    except OSError:
        return "unchanged"


def priority_of(pid: int) -> tuple[str, int]:
    """(scheduling policy name, nice value) of a process, for tests and reports."""
    names = {getattr(os, n): n for n in ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE",
                                         "SCHED_FIFO", "SCHED_RR") if hasattr(os, n)}
    return names.get(os.sched_getscheduler(pid), "?"), os.getpriority(os.PRIO_PROCESS, pid)


# --- child side -------------------------------------------------------------------------------
class _Resolved:
    """Stands in for the SavePlanner in the writer: FileSystemWriter only asks it for data."""

    def __init__(self, data: dict[Any, Any]) -> None:
        self._data = data

    def resolve_data(self, write_item: Any) -> Any:
        return self._data[write_item.index]


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(_PARENT_POLL_S)
    os._exit(1)  # the training process is gone: nothing may commit this write


def _write(message: tuple[Any, ...], fds: list[int],
           storages: dict[int, torch.UntypedStorage]) -> list[Any]:
    import torch
    from torch.distributed.checkpoint import FileSystemWriter

    _, path, plan, new_keys, keep, described, options = message
    for (key, size), fd in zip(new_keys, fds, strict=True):
        try:
            storages[key] = torch.UntypedStorage._new_shared_fd_cpu(fd, size)
        finally:
            os.close(fd)
    for key in [k for k in storages if k not in keep]:
        del storages[key]
    data: dict[Any, Any] = {}
    for index, item in described.items():
        if item[0] == "bytes":
            data[index] = io.BytesIO(item[1])
        elif item[0] == "value":
            data[index] = item[1]
        else:
            _, key, offset, shape, stride, dtype = item
            data[index] = torch.empty(0, dtype=dtype).set_(storages[key], offset, shape, stride)
    writer = FileSystemWriter(path, **options)
    return writer.write_data(plan, _Resolved(data)).wait()


def main(argv: list[str]) -> int:
    fd, parent_pid, nice = int(argv[0]), int(argv[1]), int(argv[2])
    lower_priority(0, nice, argv[3:4] != ["nice"])  # before the imports: they are the cost
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    import torch

    torch.set_num_threads(1)
    from torch.distributed.checkpoint import FileSystemWriter  # noqa: F401  (before "ready")

    sock = socket.socket(fileno=fd)
    storages: dict[int, torch.UntypedStorage] = {}
    _send(sock, ("ready",))
    while True:
        try:
            message, fds = _recv(sock)
        except EOFError:
            return 0
        if message[0] == "close":
            return 0
        if message[0] == "keep":
            for key in [k for k in storages if k not in message[1]]:
                del storages[key]
            _send(sock, ("ok", None))
            continue
        try:
            reply: tuple[str, Any] = ("ok", _write(message, fds, storages))
        except BaseException as exc:  # reported to the training process, which fails the save
            reply = ("error", f"{type(exc).__name__}: {exc}"[:500])
        _send(sock, reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
