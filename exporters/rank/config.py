"""`MonitorConfig`: the settings of a TrainingMonitor, checked once, in one place.

`TrainingMonitor(job, optimizer=..., sync_every=20)` builds one from its keyword arguments
(what scripts and the docs pass); code that keeps settings together (a framework's config,
one object for every rank) builds it and passes `config=`. The training objects (optimizer,
scheduler, checkpoint manager, process group, forwarders) stay arguments of the monitor: they
are what it acts on, not settings. Settings left None come from the TRAINWATCH_* environment
(docs/contracts.md) when the monitor starts (`resolved`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from trainwatch.exporters.contract import catalog

log = logging.getLogger(__name__)
DEFAULT_SYNC_EVERY = 10


@dataclass(frozen=True)
class MonitorConfig:
    """How a rank reports and how often ranks agree on commands (docs/training.md)."""

    # Where step reports go; None: TRAINWATCH_EXPORTER_SOCKET, else the default. Commands
    # come from the command socket beside it (catalog.command_socket), which answers a rank
    # by its kernel identity: a rank needs no token.
    socket_path: str | None = None
    # Ranks exchange commands every this many steps; None: TRAINWATCH_SYNC_EVERY, else 10.
    sync_every: int | None = None
    flush_interval: float = 0.2  # seconds between datagrams while steps are reported
    poll_interval: float = 0.5  # seconds between polls of the control API
    buffer_size: int = 8192  # step reports held for the shipper; older ones are dropped
    tensorboard_dir: str | None = None  # also write the steps as TensorBoard scalars
    mlflow_run_id: str | None = None  # also log the steps to this MLflow run
    mlflow_tracking_uri: str | None = None
    cuda_device: int | None = None  # the device whose memory and peak FLOP/s are reported
    control: bool = True  # False: never poll commands (report only)

    def __post_init__(self) -> None:
        if self.sync_every is not None and (
                isinstance(self.sync_every, bool) or not isinstance(self.sync_every, int)
                or self.sync_every < 1):
            raise ValueError("sync_every must be >= 1")
        if not self.flush_interval > 0 or not self.poll_interval > 0:
            raise ValueError("flush_interval and poll_interval must be > 0 seconds")
        if self.buffer_size < 1:
            raise ValueError("buffer_size must be >= 1")

    def resolved(self, env: Mapping[str, str] | None = None) -> MonitorConfig:
        """This config with every setting left None taken from the environment; a malformed
        TRAINWATCH_SYNC_EVERY is refused (ValueError)."""
        env = os.environ if env is None else env
        sync_every = self.sync_every
        if sync_every is None:
            raw = env.get(catalog.ENV_SYNC_EVERY, "") or str(DEFAULT_SYNC_EVERY)
            if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
                raise ValueError(f"{catalog.ENV_SYNC_EVERY}={raw!r} must be a positive integer")
            sync_every = int(raw)
        return dataclasses.replace(
            self, sync_every=sync_every,
            socket_path=self.socket_path or env.get(catalog.ENV_EXPORTER_SOCKET,
                                                    catalog.DEFAULT_EXPORTER_SOCKET))

