"""The rank-side library: what a training process imports (one subpackage, nothing node-side).

Public names, one spelling for user code and the docs::

    from trainwatch.exporters.rank import TrainingMonitor, CheckpointManager, AsyncEcsHandler
    from trainwatch.exporters.rank import MonitorConfig, HandlerConfig  # their settings, as objects
    from trainwatch.exporters.rank import HuggingFaceCallback, LightningCallback  # frameworks

They are resolved on first use (PEP 562), so `import trainwatch.exporters.rank` stays light: the
checkpoint manager pulls in torch, and a process that only logs never pays for it. Nothing
under this package imports `trainwatch.exporters.node`, `remediation` or Ansible code; the contract
it
shares with the node (datagram, identity, commands, goodput) is `trainwatch.exporters.contract`
(tests/packaging/test_layout.py checks both in a fresh interpreter).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it (the only place it is defined)
_PUBLIC = {
    "TrainingMonitor": "trainwatch.exporters.rank.client",
    "MonitorConfig": "trainwatch.exporters.rank.config",
    "CheckpointManager": "trainwatch.exporters.rank.checkpoint",
    "NoHealthyCheckpoint": "trainwatch.exporters.rank.checkpoint",
    "RollbackFailed": "trainwatch.exporters.rank.checkpoint",
    "weights_digest": "trainwatch.exporters.rank.checkpoint",
    "shard_digest": "trainwatch.exporters.rank.checkpoint",
    "ModelFlops": "trainwatch.exporters.rank.flops",
    "count_parameters": "trainwatch.exporters.rank.flops",
    "FrameworkCallback": "trainwatch.exporters.rank.framework_callbacks",
    # each needs its framework (the `hf` / `lightning` extra), imported only when named
    "HuggingFaceCallback": "trainwatch.exporters.rank.hf_callback",
    "LightningCallback": "trainwatch.exporters.rank.lightning_callback",
    "TrainwatchBatches": "trainwatch.exporters.rank.data",
    "AsyncEcsHandler": "trainwatch.exporters.rank.logs.handler",
    "HandlerConfig": "trainwatch.exporters.rank.logs.config",
}
__all__ = [
    "AsyncEcsHandler",
    "CheckpointManager",
    "FrameworkCallback",
    "HandlerConfig",
    "HuggingFaceCallback",
    "LightningCallback",
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
    from trainwatch.exporters.rank.checkpoint import (
        CheckpointManager,
        NoHealthyCheckpoint,
        RollbackFailed,
        shard_digest,
        weights_digest,
    )
    from trainwatch.exporters.rank.client import TrainingMonitor
    from trainwatch.exporters.rank.config import MonitorConfig
    from trainwatch.exporters.rank.data import TrainwatchBatches
    from trainwatch.exporters.rank.flops import ModelFlops, count_parameters
    from trainwatch.exporters.rank.framework_callbacks import FrameworkCallback
    from trainwatch.exporters.rank.hf_callback import HuggingFaceCallback
    from trainwatch.exporters.rank.lightning_callback import LightningCallback
    from trainwatch.exporters.rank.logs.config import HandlerConfig
    from trainwatch.exporters.rank.logs.handler import AsyncEcsHandler


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'trainwatch.exporters.rank' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
