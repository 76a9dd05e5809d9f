"""`HandlerConfig`: every setting of an AsyncEcsHandler, checked once, in one place.

`AsyncEcsHandler(directory, job=..., capacity=...)` builds one from its keyword arguments
(what logging configs and existing code pass); code that keeps settings together (a
framework's config file, one config for every rank's handler) builds it and passes
`config=`. Either way the handler reads only this object, and a bad value is refused here,
with ValueError, before any file or thread exists.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainwatch.exporters.contract.catalog import ENV_LOG_DIR
from trainwatch.exporters.contract.identity import validate_job, validate_rank

OVERFLOW_POLICIES = ("drop", "block")
# "ecs": the ECS logging spec, fast path; "ecs-logging": exactly what Elastic's ecs-logging
# package writes for the same record (slower; for pipelines built around that formatter).
LAYOUTS = ("ecs", "ecs-logging")


@dataclass(frozen=True)
class HandlerConfig:
    """Where the file goes, what a record says, and how the handler buffers (docs/logging.md).

    `directory` (the file is `<directory>/<job>/rank-<rank>.jsonl`) or `path`; with neither,
    the directory is TRAINWATCH_LOG_DIR (the node's training log directory, which the
    deploy's Slurm TaskProlog sets). `job` and `rank` default to the launcher environment when
    None (trainwatch.exporters.contract.identity).
    """

    directory: str | os.PathLike[str] | None = None
    path: str | os.PathLike[str] | None = None
    job: str | None = None
    rank: int | None = None
    service: str = "training"
    dataset: str | None = None  # event.dataset; None: the service name
    layout: str = "ecs"  # one of LAYOUTS
    max_bytes: int = 100 * 1024 * 1024  # rotate past this size; 0: never
    backup_count: int = 5
    capacity: int = 100_000  # records held at most (queued and encoded, not yet written)
    overflow: str = "drop"  # one of OVERFLOW_POLICIES: count and drop, or make the caller wait
    batch_size: int = 256  # records per batch, encoded by the call that fills it
    flush_interval: float = 0.2  # the writer's timer, seconds
    close_timeout: float = 10.0  # close() waits at most this long for a stalled disk
    use_orjson: bool = True
    install_signal_handler: bool = True  # flush on SIGTERM (chained to the previous handler)
    encode_on_caller: bool = True  # False: the writer thread encodes too
    wake_batches: int | None = None  # a caller wakes the writer at this many batches; None: half
    level: int = logging.NOTSET

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {OVERFLOW_POLICIES}, "
                             f"got {self.overflow!r}")
        if self.capacity < 1 or self.batch_size < 1:
            raise ValueError("capacity and batch_size must be >= 1")
        if self.flush_interval <= 0 or self.close_timeout <= 0:
            raise ValueError("flush_interval and close_timeout must be > 0")
        if self.wake_batches is not None and self.wake_batches < 1:
            raise ValueError("wake_batches must be >= 1 (or None: half the capacity)")
        if self.job is not None:
            validate_job(self.job)
        if self.rank is not None:
            validate_rank(self.rank)

    def target(self, job: str, rank: int, env: Mapping[str, str] | None = None) -> Path:
        """The file of this rank: `path`, else `<directory>/<job>/rank-<rank>.jsonl`, the
        directory defaulting to TRAINWATCH_LOG_DIR of `env` (the process environment)."""
        if self.path is not None:
            return Path(self.path)
        directory = self.directory
        if directory is None:
            directory = (os.environ if env is None else env).get(ENV_LOG_DIR) or None
        if directory is None:
            raise ValueError(f"give a log directory or an explicit path (or set {ENV_LOG_DIR})")
        return rank_log_path(directory, job, rank)


def rank_log_path(directory: str | os.PathLike[str], job: str, rank: int) -> Path:
    """`<directory>/<job>/rank-<rank>.jsonl`: one file per rank, grouped by job.

    The job name and rank become a directory and a file name, so they are validated (by
    trainwatch.exporters.contract.identity) before anything touches the filesystem.
    """
    return Path(directory) / validate_job(job) / f"rank-{validate_rank(rank)}.jsonl"
