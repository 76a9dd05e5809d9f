"""A real 2-rank gloo job that stalls the way an NCCL hang does: both ranks report a few steps
to the node training exporter (so Prometheus knows the job and its node), then rank 1 stops
stepping (sleeps) and rank 0 blocks in an all_reduce waiting for it. Each rank touches
<dir>/rank<N>.ready once it has reported. Used by the stalled_job_diagnostics acceptance test."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from trainwatch.exporters.rank.client import TrainingMonitor


def main() -> None:
    ready_dir = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    monitor = TrainingMonitor()
    for step in range(3):
        monitor.report(step, loss=1.0)
    (ready_dir / f"rank{rank}.ready").write_text(str(os.getpid()))
    if rank == 1:
        while True:
            time.sleep(1)  # the "dead" rank: alive but never steps again
    dist.all_reduce(torch.ones(1))  # blocks: rank 1 never joins


if __name__ == "__main__":
    main()
