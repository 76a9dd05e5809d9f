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
"""

from __future__ import annotations

import re
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

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


def _read(path: Path, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError:  # gone, or another user's environ while the exporter is not root
        return None


def start_time(proc: Path) -> bytes | None:
    """The process's start time in clock ticks (field 22 of /proc/<pid>/stat): with the pid,
    it names one process for good."""
    stat = _read(proc / "stat", 4096)
    if stat is None:
        return None
    fields = stat.rpartition(b")")[2].split()  # the command name may hold spaces and ')'
    return fields[19] if len(fields) > 19 else None


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
        # (pid, uid) -> (sender, start time, when checked)
        self._cache: dict[tuple[int, int], tuple[Sender, bytes | None, float]] = {}

    def sender(self, pid: int, uid: int, gid: int) -> Sender:
        key = (pid, uid)
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and now - cached[2] < RECHECK_SECONDS and cached[0].gid == gid:
            return cached[0]
        proc = self._proc / str(pid)
        started = start_time(proc) if pid > 0 else None
        if cached is not None and started is not None and started == cached[1]:
            identity = cached[0].identity  # the same process: its job does not change
        else:
            identity = Identity(uid, scope_of(proc) if started is not None else "")
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        sender = Sender(pid, uid, gid, identity)
        self._cache[key] = (sender, started, now)
        return sender

    def of_datagram(self, ancillary: list[tuple[int, int, bytes]]) -> Sender | None:
        """The sender of a datagram received with SO_PASSCRED (None without credentials)."""
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS \
                    and len(data) >= UCRED.size:
                return self.sender(*UCRED.unpack_from(data))
        return None

    def of_connection(self, conn: socket.socket) -> Sender:
        """The process at the other end of a connected Unix stream socket (SO_PEERCRED)."""
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
        return self.sender(*UCRED.unpack(raw))


def receive_credentials(sock: socket.socket) -> None:
    """Ask the kernel to attach every sender's credentials to the datagrams of `sock`."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)


ANCILLARY_BYTES = socket.CMSG_SPACE(UCRED.size)
