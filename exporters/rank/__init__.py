"""The rank-side library: what a training process imports (one subpackage, nothing node-side).

Public names, one spelling for user code and the docs::

    from exporters.rank import TrainingMonitor, CheckpointManager, AsyncEcsHandler
    from exporters.rank import MonitorConfig, HandlerConfig  # their settings, as objects

They are resolved on first use (PEP 562), so `import exporters.rank` stays light: the
checkpoint manager pulls in torch, and a process that only logs never pays for it. Nothing
under this package imports `exporters.node`, `remediation` or Ansible code; the contract it
shares with the node (datagram, identity, commands, goodput) is `exporters.contract`
(tests/packaging/test_layout.py checks both in a fresh interpreter).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it (the only place it is defined)
_PUBLIC = {
    "TrainingMonitor": "exporters.rank.client",
    "MonitorConfig": "exporters.rank.config",
    "CheckpointManager": "exporters.rank.checkpoint",
    "NoHealthyCheckpoint": "exporters.rank.checkpoint",
    "RollbackFailed": "exporters.rank.checkpoint",
    "weights_digest": "exporters.rank.checkpoint",
    "shard_digest": "exporters.rank.checkpoint",
    "ModelFlops": "exporters.rank.flops",
    "count_parameters": "exporters.rank.flops",
    "FrameworkCallback": "exporters.rank.framework_callbacks",
    "TrainwatchBatches": "exporters.rank.data",
    "AsyncEcsHandler": "exporters.rank.logs.handler",
    "HandlerConfig": "exporters.rank.logs.config",
}
__all__ = [
    "AsyncEcsHandler",
    "CheckpointManager",
    "FrameworkCallback",
    "HandlerConfig",
    "ModelFlops",
    "MonitorConfig",
    "NoHealthyCheckpoint",
    "RollbackFailed",
    "TrainingMonitor",
    "TrainwatchBatches",
    "count_parameters",
    "shard_digest",
    "weights_digest",
]

if TYPE_CHECKING:
    from exporters.rank.checkpoint import (
        CheckpointManager,
        NoHealthyCheckpoint,
        RollbackFailed,
        shard_digest,
        weights_digest,
    )
    from exporters.rank.client import TrainingMonitor
    from exporters.rank.config import MonitorConfig
    from exporters.rank.data import TrainwatchBatches
    from exporters.rank.flops import ModelFlops, count_parameters
    from exporters.rank.framework_callbacks import FrameworkCallback
    from exporters.rank.logs.config import HandlerConfig
    from exporters.rank.logs.handler import AsyncEcsHandler


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'exporters.rank' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
