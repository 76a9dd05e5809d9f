"""Whether a process that sent a datagram still runs: the same process, not its pid reused.

The node exporter watches its ranks' processes (rank_watch.py) so that a rank killed without
a word (SIGKILL, the OOM killer) is noticed within a second instead of after the rules'
minutes. The process id cannot come from the datagram: any local user in the socket's group
could name someone else's process. The kernel's credentials of each datagram (senders.py, the
one reader of them) give the pid, translated into the exporter's pid namespace (0 when the
sender is not visible there: such a rank is not watched). A pid is reused after its process
is gone, so a process is known by its pid together with its start time (/proc/<pid>/stat
field 22, clock ticks since boot), read when the exporter first hears from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# /proc/<pid>/stat states of a process that has ended: zombie (not yet reaped by its parent,
# torchrun or a test) and dead
_ENDED_STATES = frozenset("ZXx")


@dataclass(frozen=True)
class Process:
    """One process for as long as it lives: its pid and start time (pids are reused)."""

    pid: int
    start: int


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    # "pid (comm) state ...": comm may hold spaces and parentheses; it ends at the last ')'
    _, _, rest = text.rpartition(")")
    fields = rest.split()
    return fields if len(fields) >= 20 else None


def identify(pid: int, proc: Path = Path("/proc")) -> Process | None:
    """The running process with this pid now; None when there is none (or it has ended)."""
    if pid <= 0:
        return None
    fields = _stat_fields(pid, proc)
    if fields is None or fields[0] in _ENDED_STATES:
        return None
    try:
        return Process(pid, int(fields[19]))  # field 22 of the line, 20th after comm
    except ValueError:
        return None


def alive(process: Process, proc: Path = Path("/proc")) -> bool:
    """Whether this very process still runs (not a zombie, not another one with its pid)."""
    return identify(process.pid, proc) == process
