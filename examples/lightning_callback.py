"""Trainwatch in a PyTorch Lightning job: a callback, no change to the LightningModule.

    tw = TrainwatchCallback(job="my-run", checkpoint_dir="/ckpt/my-run", save_every=500)
    loader = DataLoader(tw.batches(dataset, batch_size=8), batch_size=8)
    lightning.pytorch.Trainer(max_steps=N, callbacks=[tw]).fit(module, loader)

Reports once per optimizer step, numbered by Trainwatch's own optimizer-step counter:
Lightning calls `on_train_batch_end` per micro-batch, and under `accumulate_grad_batches`
its `global_step` repeats across the micro-batches of one optimizer step; the loss reported
is the mean over the window. Checkpoints go through the CheckpointManager (module, optimizer,
LR scheduler, RNG, data position, command effects). A rollback restores them in place and
rewinds the callback's step counter (Lightning's own `global_step` cannot be rewound from a
callback and keeps counting); a skip takes effect through `batches()`, whose every batch is
`TrainingMonitor.next_batch()`. Lightning fetches one batch ahead, chosen before the
rollback: `batches()` ends its old iterator without fetching more, and that batch is skipped
by -1 from the module's `on_train_batch_start` (Lightning's own control, which skips the rest
of the epoch; Lightning ignores a callback's return value, so the callback wraps the module
instance's hook for the duration of `fit`, chaining to the module's own), so the next epoch
starts a fresh iterator at the restored position and no batch fetched before the rollback
(a skipped one included) is trained on. With this endless dataset an epoch is only a restart
of the data iterator (`max_steps` bounds training); a scheduler stepped per epoch
(`interval="epoch"`) would step there too.
Tested with the real `lightning` package (tests/training/test_framework_callbacks.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from exporters.training.checkpoint import CheckpointManager
from exporters.training.client import Control, TrainingMonitor
from exporters.training.data import TrainwatchBatches


class TrainwatchCallback(Callback):
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
        self.controls: list[Control] = []
        self.step = 0  # optimizer steps done (what reports and checkpoints are numbered by)
        self._batches: TrainwatchBatches | None = None
        self._losses: list[torch.Tensor] = []
        self._step_batches: list[int] = []
        self._last_global_step = 0
        self._drop_prefetched = False
        self._wrapped: LightningModule | None = None

    def batches(self, dataset: Sequence[Any], batch_size: int) -> TrainwatchBatches:
        """The dataset for the training DataLoader (DataLoader(..., batch_size=batch_size))."""
        self._batches = TrainwatchBatches(dataset, batch_size, self._next_batch)
        return self._batches

    def _ahead(self) -> int | None:
        return self._batches.resume_position() if self._batches is not None else None

    def _next_batch(self) -> int:
        if self.monitor is None:
            raise RuntimeError("TrainwatchCallback: training has not started")
        return self.monitor.next_batch()

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Before the fit loop fetches its first batch (it fetches before on_train_start)."""
        optimizer = trainer.optimizers[0]
        configs = trainer.lr_scheduler_configs
        scheduler = configs[0].scheduler if configs else None
        if self._checkpoint_dir:
            self.checkpoints = CheckpointManager(self._checkpoint_dir, pl_module, optimizer,
                                                 scheduler, keep=self._keep,
                                                 asynchronous=self._asynchronous)
            restored = self.checkpoints.resume()
            self.step = restored.step if restored is not None else 0
        self.monitor = TrainingMonitor(self._job, optimizer=optimizer, scheduler=scheduler,
                                       checkpoints=self.checkpoints, **self._options)
        self._last_global_step = trainer.global_step
        if self._batches is not None:
            self._install_skip(pl_module)

    def _install_skip(self, pl_module: LightningModule) -> None:
        """Lightning skips a batch (and the rest of the epoch) only when the module's own
        `on_train_batch_start` returns -1 (a callback's return value is ignored), so this
        instance's hook is wrapped: -1 for the batch fetched before a rollback, else the
        module's own answer. Removed again at the end of training."""
        original = pl_module.on_train_batch_start

        def on_train_batch_start(batch: Any, batch_idx: int) -> int | None:
            if self._drop_prefetched:  # fetched before the rollback: not trained on
                self._drop_prefetched = False
                return -1
            return original(batch, batch_idx)

        pl_module.on_train_batch_start = on_train_batch_start  # type: ignore[method-assign]
        self._wrapped = pl_module

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if self.monitor is None:
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach())
        if self._batches is not None:
            consumed = self._batches.consumed()
            if consumed is not None:
                self._step_batches.append(consumed)
        if trainer.global_step == self._last_global_step:
            return  # a micro-batch inside the accumulation window: no optimizer step yet
        self._last_global_step = trainer.global_step
        self.step += 1
        mean = torch.stack(self._losses).mean() if self._losses else None
        self.monitor.report(self.step, loss=mean,
                            batch=self._step_batches[0] if self._step_batches else None)
        self._losses, self._step_batches = [], []
        if (self.checkpoints is not None and self._save_every
                and self.step % self._save_every == 0):
            self.checkpoints.save(self.step, loss=mean, next_batch=self._ahead())
        result = self.monitor.step_end(self.step)
        self.controls.append(result)
        if result.rolled_back:
            self.step = result.next_step - 1
            if self._batches is not None:  # the batch fetched ahead is dropped (above)
                self._drop_prefetched = bool(self._batches.restart())

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._wrapped is not None:  # the class's own hook again
            del self._wrapped.on_train_batch_start
            self._wrapped = None
        if self.monitor is not None:
            self.monitor.close()
        if self.checkpoints is not None:
            self.checkpoints.close()
