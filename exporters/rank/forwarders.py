"""Optional copies of the per-step values to TensorBoard, MLflow and Weights & Biases, so teams
keep their tools.

Forwarders run on their own thread behind a bounded queue: MLflow's tracking store can take
milliseconds to seconds per call, and neither the training loop nor the datagram shipping may
wait for it. When the queue is full the batch is dropped and counted.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from typing import Protocol

log = logging.getLogger(__name__)

# (step, wall time, duration, loss, lr, grad_norm, data_wait), as shipped.
StepRow = tuple[int, float | None, float | None, float | None, float | None, float | None,
                float | None]
_NAMES = ("step_duration_seconds", "loss", "learning_rate", "grad_norm", "data_wait_seconds")


def _scalars(row: StepRow) -> list[tuple[str, float]]:
    """Finite values of one row by metric name (MLflow rejects NaN; TensorBoard shows gaps)."""
    return [(name, value) for name, value in zip(_NAMES, row[2:], strict=True)
            if value is not None and math.isfinite(value)]


class Forwarder(Protocol):
    def write(self, rows: list[StepRow]) -> None: ...
    def close(self) -> None: ...


class TensorBoardForwarder:
    """Writes event files with torch's SummaryWriter (tags `trainwatch/<name>`)."""

    def __init__(self, log_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=log_dir)

    def write(self, rows: list[StepRow]) -> None:
        for row in rows:
            for name, value in _scalars(row):
                self._writer.add_scalar(f"trainwatch/{name}", value, global_step=row[0],
                                        walltime=row[1])

    def close(self) -> None:
        self._writer.close()


class MlflowForwarder:
    """Logs batches to an MLflow run with MlflowClient.log_batch (one call per batch)."""

    def __init__(self, run_id: str, tracking_uri: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=tracking_uri)
        self._run_id = run_id

    def write(self, rows: list[StepRow]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(key=name, value=value,
                          timestamp=int((row[1] or time.time()) * 1000), step=row[0])
                   for row in rows for name, value in _scalars(row)]
        for start in range(0, len(metrics), 1000):  # MLflow's per-batch limit
            self._client.log_batch(self._run_id, metrics=metrics[start:start + 1000])

    def close(self) -> None:
        pass


class WandbForwarder:
    """Logs to a Weights & Biases run: `run` (one the script started with wandb.init), or one
    this forwarder starts with `wandb.init(**init_kwargs)` and finishes on close.

    Values go under `trainwatch/<name>` against their own x-axis `trainwatch/step`
    (define_metric), not W&B's internal step: W&B drops a logged step lower than one it has
    seen, and after a checkpoint rollback the training step does go back. `mode="offline"`
    (or WANDB_MODE=offline) writes the run to disk for a later `wandb sync`, with no network.
    """

    def __init__(self, run: object = None, **init_kwargs: object) -> None:
        import wandb

        self._owned = run is None
        self._run = run if run is not None else wandb.init(**init_kwargs)
        self._run.define_metric("trainwatch/step")  # type: ignore[attr-defined]
        self._run.define_metric("trainwatch/*",  # type: ignore[attr-defined]
                                step_metric="trainwatch/step")

    def write(self, rows: list[StepRow]) -> None:
        for row in rows:
            values = {f"trainwatch/{name}": value for name, value in _scalars(row)}
            if values:
                values["trainwatch/step"] = row[0]
                self._run.log(values)  # type: ignore[attr-defined]

    def close(self) -> None:
        if self._owned:
            self._run.finish()  # type: ignore[attr-defined]


class ForwarderThread(threading.Thread):
    """Feeds every forwarder from a bounded queue; a failing forwarder is logged, not fatal."""

    def __init__(self, forwarders: list[Forwarder], max_batches: int = 256) -> None:
        super().__init__(name="trainwatch-forwarders", daemon=True)
        self._forwarders = forwarders
        self._queue: queue.Queue[list[StepRow] | None] = queue.Queue(max_batches)
        self.dropped_batches = 0
        self.errors = 0

    def submit(self, rows: list[StepRow]) -> None:
        try:
            self._queue.put_nowait(rows)
        except queue.Full:
            self.dropped_batches += 1

    def run(self) -> None:
        while True:
            rows = self._queue.get()
            if rows is None:
                break
            for forwarder in self._forwarders:
                try:
                    forwarder.write(rows)
                except Exception as exc:  # a tracking server outage must not stop us
                    self.errors += 1
                    log.warning("forwarder %s failed: %s", type(forwarder).__name__, exc)
        for forwarder in self._forwarders:
            try:
                forwarder.close()
            except Exception as exc:
                log.warning("closing forwarder %s failed: %s", type(forwarder).__name__, exc)

    def close(self, timeout: float = 10.0) -> bool:
        """Let queued batches drain, then stop (waits at most `timeout`). False, with a
        warning, when the forwarders were still writing or finishing at the deadline (a
        tracking client's finish can take long on a loaded host): what they hold then is left
        to their own exit handlers."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.warning("forwarders: queue still full after %.0fs; not waiting for them", timeout)
            return False
        self.join(timeout)
        if self.is_alive():
            log.warning("forwarders: still writing or finishing after %.0fs; not waiting "
                        "longer", timeout)
            return False
        return True
