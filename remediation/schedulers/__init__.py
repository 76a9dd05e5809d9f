"""Scheduler adapters: one interface (base.Scheduler), one small module per scheduler.

`for_config` builds the configured one. Every name a command gets is a scheduler node name
from the inventory's mapping (trainwatch.remediation.faults.NodeMap) or a job id the scheduler
itself
reported; every command is an argv, never a shell string.
"""

from __future__ import annotations

from trainwatch.remediation.config import Config
from trainwatch.remediation.schedulers.base import Scheduler, SchedulerError


def for_config(config: Config) -> Scheduler:
    """The configured scheduler; SchedulerError when none is."""
    settings = config.scheduler
    if settings is None:
        raise SchedulerError("no scheduler is configured (config `scheduler:`): scheduler "
                             "actions are refused")
    if settings.kind == "slurm":
        from trainwatch.remediation.schedulers.slurm import SlurmScheduler

        return SlurmScheduler(settings)
    if settings.kind == "torchrun_elastic":
        from trainwatch.remediation.schedulers.torchrun_elastic import TorchrunElasticScheduler

        return TorchrunElasticScheduler(config)
    raise SchedulerError(f"unknown scheduler kind {settings.kind!r}")


__all__ = ["for_config"]
