"""Which job and rank a log file belongs to, and where that file lives.

The job name and rank become a directory and a file name, so they are validated here, once,
before anything touches the filesystem.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from exporters.catalog import job_from_env

# Same shape the rest of Trainwatch accepts for a job label: safe as a path component too.
JOB_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_RANK_ENV = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


def detect_job(env: Mapping[str, str] | None = None) -> str:
    """The job name from the launcher environment, or "default"."""
    env = os.environ if env is None else env
    return job_from_env(env) or "default"


def detect_rank(env: Mapping[str, str] | None = None) -> int:
    """The global rank from torchrun, Slurm or Open MPI variables, or 0."""
    env = os.environ if env is None else env
    for name in _RANK_ENV:
        if name in env:
            try:
                return int(env[name])
            except ValueError as exc:
                raise ValueError(f"{name}={env[name]!r} is not an integer rank") from exc
    return 0


def validate_job(job: str) -> str:
    """Refuse a job name that is not a safe label value and path component."""
    if not isinstance(job, str) or not JOB_NAME_PATTERN.match(job):
        raise ValueError(f"job name {job!r} must match {JOB_NAME_PATTERN.pattern}")
    return job


def validate_rank(rank: int) -> int:
    """Refuse a rank that is not a non-negative integer."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank {rank!r} must be a non-negative integer")
    return rank


def rank_log_path(directory: str | os.PathLike[str], job: str, rank: int) -> Path:
    """`<directory>/<job>/rank-<rank>.jsonl`: one file per rank, grouped by job."""
    return Path(directory) / validate_job(job) / f"rank-{validate_rank(rank)}.jsonl"
