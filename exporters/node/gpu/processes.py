"""Attribute a GPU process to a training job and rank from its environment.

NVML reports only a pid and its memory. The launcher (torchrun, Slurm, Trainwatch's own
wrapper) puts the job and rank into the process environment, which Linux exposes read-only in
/proc/<pid>/environ. That file is untrusted input: we read at most `MAX_ENVIRON_BYTES`, keep
only the variables we know, and drop values that do not look like a job name or a rank (a
label value must stay short and bounded). The job is named by
trainwatch.exporters.contract.identity.job_from_env,
the one identity function the training client and the log handler use too (explicit
TRAINWATCH_JOB, else the launcher's job id, else an id derived from the rendezvous), so a GPU
process is attributed to the job its training metrics carry. Unreadable environments
(another user's process while not root, a pid namespace we cannot see) count as
unattributed, never as errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from trainwatch.exporters.contract.identity import (
    JOB_ENV_VARIABLES,
    RANK_VARIABLES,
    is_job_name,
    job_from_env,
)

MAX_ENVIRON_BYTES = 256 * 1024
# What job_from_env reads: the job variables, then the rendezvous a job id is derived from.
JOB_VARIABLES = (*JOB_ENV_VARIABLES, "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE")
# The launchers' rank variables, then MPICH/Intel MPI's (their processes are attributed a rank
# even though the training client does not read it).
PROCESS_RANK_VARIABLES = (*RANK_VARIABLES, "PMI_RANK")
_WANTED = frozenset(JOB_VARIABLES + PROCESS_RANK_VARIABLES)
_VALID_RANK = re.compile(r"[0-9]{1,7}")
UNATTRIBUTED = ("", "")

EnvironSource = Callable[[int], Mapping[str, str] | None]


def read_proc_environ(pid: int, proc_root: Path = Path("/proc")) -> dict[str, str] | None:
    """The wanted variables of `pid`, or None when the environment cannot be read."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        with open(proc_root / str(pid) / "environ", "rb") as handle:
            raw = handle.read(MAX_ENVIRON_BYTES + 1)
    except OSError:
        return None
    entries = raw.split(b"\0")
    if len(raw) > MAX_ENVIRON_BYTES:
        entries = entries[:-1]  # the last entry may be cut in the middle
    found: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.partition(b"=")
        if not sep:
            continue
        name = key.decode("ascii", "replace")
        if name in _WANTED:
            found[name] = value.decode("utf-8", "replace")
    return found


def job_and_rank(env: Mapping[str, str] | None) -> tuple[str, str]:
    """(training_job, rank) label values; empty strings when unknown or invalid."""
    if not env:
        return UNATTRIBUTED
    # An invalid explicit name is not skipped for the next variable: the training client
    # refuses it, so any other name would be a job no training metrics carry.
    job = job_from_env(env) or ""
    if not is_job_name(job):
        job = ""
    rank = ""
    for name in PROCESS_RANK_VARIABLES:
        value = env.get(name, "")
        if _VALID_RANK.fullmatch(value):
            rank = str(int(value))
            break
    return job, rank


class ProcessAttributor:
    """Caches each pid's (job, rank): a process's initial environment never changes.

    `retain` drops pids not seen in the latest cycle, so a reused pid is re-read once its
    previous owner has left the GPU for a cycle.
    """

    def __init__(self, source: EnvironSource = read_proc_environ) -> None:
        self._source = source
        self._cache: dict[int, tuple[str, str]] = {}

    def attribute(self, pid: int) -> tuple[str, str]:
        cached = self._cache.get(pid)
        if cached is None:
            cached = job_and_rank(self._source(pid))
            self._cache[pid] = cached
        return cached

    def retain(self, pids: Iterable[int]) -> None:
        keep = set(pids)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]
