"""Where a rank's log file lives. Which job and rank it belongs to is exporters.identity's
(the names below are imported from there for this package's modules).

The job name and rank become a directory and a file name, so they are validated (by
exporters.identity) before anything touches the filesystem.
"""

from __future__ import annotations

import os
from pathlib import Path

from exporters.identity import detect_job, detect_rank, validate_job, validate_rank

# detect_* are imported from here by the handler (exporters/logs/handler.py).
__all__ = ["detect_job", "detect_rank", "rank_log_path", "validate_job", "validate_rank"]


def rank_log_path(directory: str | os.PathLike[str], job: str, rank: int) -> Path:
    """`<directory>/<job>/rank-<rank>.jsonl`: one file per rank, grouped by job."""
    return Path(directory) / validate_job(job) / f"rank-{validate_rank(rank)}.jsonl"
