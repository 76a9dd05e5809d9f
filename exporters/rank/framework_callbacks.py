"""The framework-independent part of a training framework's Trainwatch callback.

The Hugging Face and Lightning callbacks (hf_callback.py, lightning_callback.py) differ
only in which hooks they are called from and how they find the model, optimizer and step
number; the options, the monitor and checkpoint-manager creation and the once-per-optimizer-
step report, periodic save and control are the same, so they live here once and each
callback inherits them.

Data wait is the time the trainer spends in its loader between two steps: from the end of the
trainer's own work (a step, a log, an evaluation, a save: `_work_done`) to the hook that runs
once the next batch is in hand (`_batch_ready`), summed over the step's micro-batches.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from trainwatch.exporters.rank.checkpoint import CheckpointManager
from trainwatch.exporters.rank.client import Control, TrainingMonitor
from trainwatch.exporters.rank.data import TrainwatchBatches


class FrameworkCallback:
    """Options, monitor, checkpoints and the per-step logic shared by framework callbacks.

    A subclass calls `_start` when training starts, `_observe` per training micro-batch,
    `_step` once per optimizer step (it returns the command's Control) and `_close` at the
    end; the framework's own step bookkeeping (rewinding on rollback) stays in the subclass.
    It calls `_batch_ready` from the first hook after a batch was fetched and `_work_done`
    after the trainer's own work between steps (logging, evaluation, saving).
    """

    def __init__(self, job: str | None = None, checkpoint_dir: str | None = None,
                 save_every: int | None = None, keep: int = 3, asynchronous: bool = True,
                 **monitor_options: Any) -> None:
        self._job = job
        self._checkpoint_dir = checkpoint_dir
        self._save_every = save_every
        self._keep = keep
        self._asynchronous = asynchronous
        self._options = monitor_options
        self.monitor: TrainingMonitor | None = None
        self.checkpoints: CheckpointManager | None = None
        self.controls: list[Control] = []  # what step_end returned, for the curious
        self._batches: TrainwatchBatches | None = None
        self._losses: list[torch.Tensor] = []
        self._step_batches: list[int] = []
        self._loading_since: float | None = None  # perf_counter: the trainer's work ended
        self._data_wait = 0.0  # loader seconds of the step in progress

    def batches(self, dataset: Sequence[Any], batch_size: int) -> TrainwatchBatches:
        """The training dataset to give the framework (batched by batch_size)."""
        self._batches = TrainwatchBatches(dataset, batch_size, self._next_batch)
        return self._batches

    def _ahead(self) -> int | None:
        return self._batches.resume_position() if self._batches is not None else None

    def _next_batch(self) -> int:
        if self.monitor is None:
            raise RuntimeError("TrainwatchCallback: training has not started")
        return self.monitor.next_batch()

    def _start(self, model: Any, optimizer: Any, scheduler: Any) -> int | None:
        """Create the checkpoint manager (resuming from the newest checkpoint) and the
        monitor; the restored step, or None when nothing was restored."""
        restored_step = None
        if self._checkpoint_dir:
            self.checkpoints = CheckpointManager(self._checkpoint_dir, model, optimizer,
                                                 scheduler, keep=self._keep,
                                                 asynchronous=self._asynchronous)
            restored = self.checkpoints.resume()
            restored_step = restored.step if restored is not None else None
        self.monitor = TrainingMonitor(self._job, optimizer=optimizer, scheduler=scheduler,
                                       checkpoints=self.checkpoints, **self._options)
        self._work_done()
        return restored_step

    def _work_done(self) -> None:
        """The trainer's own work ended: what follows, up to `_batch_ready`, is its loader."""
        self._loading_since = time.perf_counter()

    def _batch_ready(self) -> None:
        """A batch is in hand: the time since `_work_done` was data wait."""
        if self._loading_since is not None:
            self._data_wait += time.perf_counter() - self._loading_since
            self._loading_since = None

    def _observe(self, loss: torch.Tensor | None) -> None:
        """One training micro-batch: its loss (None: not a tensor) and its batch."""
        if loss is not None:
            self._losses.append(loss.detach())
        if self._batches is not None:
            batch = self._batches.consumed()
            if batch is not None:
                self._step_batches.append(batch)

    def _step(self, step: int) -> Control:
        """One optimizer step: report the mean loss over the accumulation window, save
        every `save_every` steps, then apply any command and return its Control."""
        if self.monitor is None:
            raise RuntimeError("TrainwatchCallback: training has not started")
        loss = torch.stack(self._losses).mean() if self._losses else None
        self.monitor.report(step, loss=loss,
                            batch=self._step_batches[0] if self._step_batches else None,
                            data_wait=self._data_wait)
        self._losses, self._step_batches, self._data_wait = [], [], 0.0
        if self.checkpoints is not None and self._save_every and step % self._save_every == 0:
            self.checkpoints.save(step, loss=loss, next_batch=self._ahead())
        result = self.monitor.step_end(step)
        self.controls.append(result)
        self._work_done()
        return result

    def _close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
        if self.checkpoints is not None:
            self.checkpoints.close()
