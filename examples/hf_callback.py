"""Trainwatch in a Hugging Face `transformers.Trainer` job: a TrainerCallback.

    tw = TrainwatchCallback(job="my-run", checkpoint_dir="/ckpt/my-run", save_every=500)
    train_data = tw.batches(dataset, batch_size=8)     # data position owned by Trainwatch
    trainer = Trainer(model=model, args=TrainingArguments(..., per_device_train_batch_size=8,
                      max_steps=N), train_dataset=train_data, callbacks=[tw])

Reports every optimizer step (not every `logging_steps`): the loss of each training
micro-batch is taken from the model's output by a forward hook, and the mean over the
gradient-accumulation window is reported once per optimizer step, numbered by the optimizer
step (`state.global_step` counts those, once each). Checkpoints go through the
CheckpointManager (model, optimizer, LR scheduler, RNG, data position, command effects);
the Trainer's own checkpointing can stay off. A rollback command restores them in place and
rewinds `state.global_step` to the restored step; a skip takes effect through `batches()`,
whose every batch is `TrainingMonitor.next_batch()`. The Trainer fetches one batch ahead
(accelerate's DataLoaderShard), chosen before the rollback: the callback drops it by ending
the epoch (`control.should_epoch_stop`, the Trainer's own control) and `batches()` ends its
old iterator, so the next epoch's first batch is the restored position and no batch fetched
before the rollback (a skipped one included) is trained on. With this endless dataset an
epoch is only a restart of the data iterator (`max_steps` bounds training).
Tested with the real `transformers` package (tests/training/test_framework_callbacks.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from exporters.training.checkpoint import CheckpointManager
from exporters.training.client import Control, TrainingMonitor
from exporters.training.data import TrainwatchBatches


class TrainwatchCallback(TrainerCallback):
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
        self._hook: Any = None

    def batches(self, dataset: Sequence[Any], batch_size: int) -> TrainwatchBatches:
        """The train_dataset to give the Trainer (per_device_train_batch_size=batch_size)."""
        self._batches = TrainwatchBatches(dataset, batch_size, self._next_batch)
        return self._batches

    def _ahead(self) -> int | None:
        return self._batches.resume_position() if self._batches is not None else None

    def _next_batch(self) -> int:
        if self.monitor is None:
            raise RuntimeError("TrainwatchCallback: training has not started")
        return self.monitor.next_batch()

    def _capture(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        """Forward hook: the loss of every training micro-batch, and the batch it came from."""
        loss = getattr(output, "loss", None)
        if not module.training or loss is None:
            return
        self._losses.append(loss.detach())
        if self._batches is not None:
            batch = self._batches.consumed()
            if batch is not None:
                self._step_batches.append(batch)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, model: Any = None, optimizer: Any = None,
                       lr_scheduler: Any = None, **kwargs: Any) -> None:
        if self._checkpoint_dir:
            self.checkpoints = CheckpointManager(self._checkpoint_dir, model, optimizer,
                                                 lr_scheduler, keep=self._keep,
                                                 asynchronous=self._asynchronous)
            restored = self.checkpoints.resume()
            if restored is not None:
                state.global_step = restored.step
        self.monitor = TrainingMonitor(self._job, optimizer=optimizer, scheduler=lr_scheduler,
                                       checkpoints=self.checkpoints, **self._options)
        self._hook = model.register_forward_hook(self._capture, with_kwargs=True)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        """Once per optimizer step (after the whole accumulation window)."""
        if self.monitor is None:
            return
        step = state.global_step
        loss = torch.stack(self._losses).mean() if self._losses else None
        self.monitor.report(step, loss=loss,
                            batch=self._step_batches[0] if self._step_batches else None)
        self._losses, self._step_batches = [], []
        if self.checkpoints is not None and self._save_every and step % self._save_every == 0:
            self.checkpoints.save(step, loss=loss, next_batch=self._ahead())
        result = self.monitor.step_end(step)
        self.controls.append(result)
        if result.rolled_back:
            state.global_step = result.next_step - 1  # the Trainer adds one per step
            if self._batches is not None:  # drop the batch fetched ahead: a fresh iterator
                self._batches.restart()
                control.should_epoch_stop = True

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
        if self.monitor is not None:
            self.monitor.close()
        if self.checkpoints is not None:
            self.checkpoints.close()
