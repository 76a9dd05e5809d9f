"""A tiny real training script for the torchrun test: every rank logs through
AsyncEcsHandler; rank 1 then reports a NaN loss and dies with an OOM-style exception.

Run by torchrun from tests/logs/test_torchrun_job.py, never imported by the tests.
"""

from __future__ import annotations

import logging
import sys

import torch
import torch.distributed as dist

from trainwatch.exporters.rank.logs.handler import AsyncEcsHandler


def main() -> None:
    dist.init_process_group("gloo")
    handler = AsyncEcsHandler(sys.argv[1])  # job and rank from TRAINWATCH_JOB and RANK
    log = logging.getLogger("train")
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    weight = torch.ones(4)
    for step in range(20):
        dist.all_reduce(weight)
        log.info("step %d loss=%.4f", step, 1.0 / (step + 1))
    dist.barrier()
    if dist.get_rank() == 1:
        log.warning("loss is nan at step %d, skipping", 20)
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated on CPU)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
