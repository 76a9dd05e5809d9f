"""Who is on the other end of the node's Unix sockets: the kernel's word, never the message's.

A node is shared: jobs of several users report to one exporter. A datagram's job name is
whatever its sender wrote, so the exporter takes the sender's identity from the kernel instead
(SCM_CREDENTIALS on the report socket, SO_PEERCRED on the command socket: pid, uid, gid, which
an unprivileged process cannot forge) and from it the job the process runs in:

- its Slurm job: the `job_<id>` element of /proc/<pid>/cgroup (slurmstepd puts every step of a
  job there, and only root can move a process out), else SLURM_JOB_ID in /proc/<pid>/environ;
- else torchrun's run id (TORCHELASTIC_RUN_ID, when --rdzv-id named one);
- else nothing beyond the uid.

An identity is the uid together with that scope. The environment is the sender's own, so a
scope read from it is only trusted together with the uid the kernel gave: a user can name any
Slurm job id in its environment, but not another user's uid. The store (store.py) binds each job
name to the identity of its first sender.

Lookups are cached by (pid, uid): a reused pid of another user is another key, and an entry is
checked against the process's start time every RECHECK_SECONDS, so a pid reused by the same
user moves to its new job within that time. The cost per datagram is one dictionary lookup.

This module is the exporter's one reader of the kernel's credentials: the receiver asks it for
each datagram's Sender, whose identity the store checks the job name against, and whose
process (pid and start time, peers.py) the rank watch follows to see a killed rank at once.
"""

from __future__ import annotations

import logging
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from trainwatch.exporters.node.training import peers

UCRED = struct.Struct("iII")  # struct ucred: pid_t pid, uid_t uid, gid_t gid
RECHECK_SECONDS = 5.0
MAX_CACHED = 4096
MAX_ENVIRON_BYTES = 1 << 20
_SLURM_CGROUP_JOB = re.compile(rb"/job_([0-9]{1,12})(?:/|$)")
_SCOPE_VARIABLES = ((b"SLURM_JOB_ID=", "slurm"), (b"TORCHELASTIC_RUN_ID=", "torchelastic"))
_PLACEHOLDER_RUN_IDS = frozenset({b"", b"none"})


@dataclass(frozen=True)
class Identity:
    """The user and the job (scope) a process runs as; what a job name is bound to."""

    uid: int
    scope: str  # "slurm:<id>", "torchelastic:<run id>", or "" (the uid alone)

    def __str__(self) -> str:
        return f"uid {self.uid}" + (f" ({self.scope})" if self.scope else "")


@dataclass(frozen=True)
class Sender:
    """One datagram's or connection's sender, as the kernel reported it."""

    pid: int
    uid: int
    gid: int
    identity: Identity
    # the process itself (pid and start time) while it runs and is visible from here; None
    # otherwise (pid 0 from another pid namespace, or gone before its first datagram was read)
    process: peers.Process | None


def _read(path: Path, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError:  # gone, or another user's environ while the exporter is not root
        return None


def scope_of(proc: Path) -> str:
    """The job a process runs in, from what the kernel keeps for it (see the module doc)."""
    cgroup = _read(proc / "cgroup", 65536)
    if cgroup:
        found = _SLURM_CGROUP_JOB.search(cgroup)
        if found:
            return "slurm:" + found.group(1).decode()
    environ = _read(proc / "environ", MAX_ENVIRON_BYTES)
    if environ:
        entries = environ.split(b"\0")
        for prefix, kind in _SCOPE_VARIABLES:
            for entry in entries:
                if entry.startswith(prefix):
                    value = entry[len(prefix):]
                    if value not in _PLACEHOLDER_RUN_IDS:
                        return f"{kind}:{value[:128].decode('utf-8', 'replace')}"
                    break
    return ""


class Resolver:
    """Kernel credentials to Identity, cached (see the module doc for why that is safe)."""

    def __init__(self, proc_root: Path = Path("/proc"), clock=time.monotonic) -> None:
        self._proc = proc_root
        self._clock = clock
        # (pid, uid) -> (sender, when checked)
        self._cache: dict[tuple[int, int], tuple[Sender, float]] = {}

    def sender(self, pid: int, uid: int, gid: int) -> Sender:
        key = (pid, uid)
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and now - cached[1] < RECHECK_SECONDS and cached[0].gid == gid:
            return cached[0]
        process = peers.identify(pid, self._proc)
        if cached is not None and (process is None or process == cached[0].process):
            # the same process (its job does not change), or one that ended after sending:
            # its datagrams still queued keep the identity it had
            sender = Sender(pid, uid, gid, cached[0].identity, cached[0].process)
        else:
            scope = scope_of(self._proc / str(pid)) if pid > 0 else ""
            sender = Sender(pid, uid, gid, Identity(uid, scope), process)
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        self._cache[key] = (sender, now)
        return sender

    def of_datagram(self, ancillary: list[tuple[int, int, bytes]]) -> Sender | None:
        """The sender of a datagram received with SO_PASSCRED (None without credentials)."""
        found = credentials(ancillary)
        return self.sender(*found) if found is not None else None

    def of_connection(self, conn: socket.socket) -> Sender:
        """The process at the other end of a connected Unix stream socket (SO_PEERCRED)."""
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
        return self.sender(*UCRED.unpack(raw))


def pass_credentials(sock: socket.socket) -> None:
    """Ask the kernel to attach every sender's credentials to the datagrams of `sock` (before
    bind: no datagram arrives without them)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)


ANCILLARY_BYTES = socket.CMSG_SPACE(UCRED.size)


def credentials(ancillary: list[tuple[int, int, bytes]]) -> tuple[int, int, int] | None:
    """(pid, uid, gid) from recvmsg's ancillary data; None when the kernel attached none. The
    pid is 0 for a sender outside the exporter's pid namespace."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS \
                and len(data) >= UCRED.size:
            pid, uid, gid = UCRED.unpack_from(data)
            return max(pid, 0), uid, gid
    return None


class RefusalLog:
    """Says once per (sender, job) that a channel refused a process's claim to a job: every
    refusal is counted by the caller, but a process that keeps trying must not flood the log.
    Thread-safe (the command socket serves connections on threads); bounded."""

    LIMIT = 4096

    def __init__(self, channel: str) -> None:
        self._channel = channel
        self._seen: set[tuple[int, int, str]] = set()
        self._lock = threading.Lock()

    def once(self, sender: Sender, job: str, owner: object) -> None:
        key = (sender.pid, sender.uid, job)
        with self._lock:
            if key in self._seen:
                return
            if len(self._seen) >= self.LIMIT:
                self._seen.clear()
            self._seen.add(key)
        logging.getLogger(__name__).warning(
            "refused %s of pid %d (uid %d) for job %r: it belongs to %s", self._channel,
            sender.pid, sender.uid, job, owner)
