"""Who am I in the job? Rank, local rank, world size and restart count from the launcher.

Launchers export these under different names (trainwatch.exporters.contract.identity.LAUNCHERS);
reading them
here means a training script never has to pass them by hand. Order of precedence:
torchrun/torchelastic, Slurm, Open MPI (also what Horovod's mpirun sets), then a
single-process default.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from trainwatch.exporters.contract.identity import LAUNCHERS, detect_job, validate_job


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job."""

    job: str
    rank: int
    local_rank: int
    world_size: int
    restarts: int


def _int(env: Mapping[str, str], name: str | None, default: int) -> int:
    if name is None or name not in env:
        return default
    try:
        return int(env[name])
    except ValueError:
        return default


def detect(env: Mapping[str, str] | None = None, job: str | None = None,
           rank: int | None = None, local_rank: int | None = None,
           world_size: int | None = None, restarts: int | None = None) -> RankInfo:
    """Fill every value not given explicitly from the first launcher whose rank variable is set.

    A job name must be a short, label-safe identifier because it becomes a Prometheus label
    value and part of control-API paths; anything else is refused with ValueError.
    """
    env = os.environ if env is None else env
    names = next((n for n in LAUNCHERS if n[0] in env), None)
    if names is not None:
        rank = _int(env, names[0], 0) if rank is None else rank
        local_rank = _int(env, names[1], 0) if local_rank is None else local_rank
        world_size = _int(env, names[2], 1) if world_size is None else world_size
        if restarts is None:  # every level's: torchrun's own restarts inside a Slurm job
            # that was requeued start from 0 again, so its requeues (SLURM_RESTART_COUNT:
            # srun's tasks and torchrun's workers both carry it) count as well
            restarts = sum(_int(env, level[3], 0) for level in LAUNCHERS
                           if level[3] is not None and level[0] in env)
    if job is None:
        job = detect_job(env)
    validate_job(job)
    info = RankInfo(job=job, rank=rank or 0, local_rank=local_rank or 0,
                    world_size=world_size or 1, restarts=restarts or 0)
    if not 0 <= info.rank < info.world_size:
        raise ValueError(f"rank {info.rank} outside world size {info.world_size}")
    return info


def node_name() -> str:
    """Short hostname, the `node` label's default."""
    return socket.gethostname().split(".")[0]
