"""Trainwatch in a PyTorch Lightning job: a callback, no change to the LightningModule.

    trainer = lightning.pytorch.Trainer(callbacks=[TrainwatchCallback(job="my-run")])

Not run by Trainwatch's tests (Lightning is not installed in its CI); the calls it makes are
the ones examples/train_ddp.py makes and tests/training exercises with real torchrun jobs.
Rollback restores model, optimizer, scheduler and RNG in place; Lightning's own step counter
keeps counting (its fit loop cannot be rewound from a callback) and skip_batches is ignored.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from exporters.training.checkpoint import CheckpointManager
from exporters.training.client import TrainingMonitor


class TrainwatchCallback(Callback):
    def __init__(self, job: str | None = None, checkpoint_dir: str | None = None,
                 **monitor_options: Any) -> None:
        self._job = job
        self._checkpoint_dir = checkpoint_dir
        self._options = monitor_options
        self.monitor: TrainingMonitor | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        optimizer = trainer.optimizers[0]
        configs = trainer.lr_scheduler_configs
        scheduler = configs[0].scheduler if configs else None
        checkpoints = (CheckpointManager(self._checkpoint_dir, pl_module, optimizer, scheduler)
                       if self._checkpoint_dir else None)
        self.monitor = TrainingMonitor(self._job, optimizer=optimizer, scheduler=scheduler,
                                       checkpoints=checkpoints, **self._options)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if self.monitor is None:
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        # A detached tensor: converted to float on Trainwatch's thread, not this one.
        self.monitor.report(trainer.global_step,
                            loss=loss.detach() if loss is not None else None,
                            samples=len(batch[0]) if isinstance(batch, (list, tuple)) else None)
        self.monitor.step_end(trainer.global_step)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.monitor is not None:
            self.monitor.close()
