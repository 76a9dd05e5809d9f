"""Trainwatch in a PyTorch Lightning job: a callback, no change to the LightningModule.

    tw = LightningCallback(job="my-run", checkpoint_dir="/ckpt/my-run", save_every=500)
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

from typing import Any

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ModuleNotFoundError as exc:  # the client installs without the framework
    raise ModuleNotFoundError(
        f"LightningCallback needs lightning: pip install 'trainwatch-gpu[lightning]' ({exc})",
        name=exc.name) from exc

import torch

from trainwatch.exporters.rank.framework_callbacks import FrameworkCallback


class LightningCallback(FrameworkCallback, Callback):
    """Lightning's hooks around the shared FrameworkCallback (options, monitor, steps)."""

    def __init__(self, *args: Any, **options: Any) -> None:
        """The options of FrameworkCallback (job, checkpoint_dir, save_every, ...)."""
        super().__init__(*args, **options)
        self.step = 0  # optimizer steps done (what reports and checkpoints are numbered by)
        self._last_global_step = 0
        self._drop_prefetched = False
        self._wrapped: LightningModule | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Before the fit loop fetches its first batch (it fetches before on_train_start)."""
        configs = trainer.lr_scheduler_configs
        scheduler = configs[0].scheduler if configs else None
        restored = self._start(pl_module, trainer.optimizers[0], scheduler)
        if self._checkpoint_dir:
            self.step = restored if restored is not None else 0
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

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._batch_ready()  # the fetch loop just handed the batch over

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._loading_since is not None:  # evaluation is not the loader's time
            self._work_done()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if self.monitor is None:
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self._observe(loss if isinstance(loss, torch.Tensor) else None)
        if trainer.global_step == self._last_global_step:
            self._work_done()  # the next micro-batch's fetch is data wait of this step
            return  # a micro-batch inside the accumulation window: no optimizer step yet
        self._last_global_step = trainer.global_step
        self.step += 1
        result = self._step(self.step)
        if result.rolled_back:
            self.step = result.next_step - 1
            if self._batches is not None:  # the batch fetched ahead is dropped (above)
                self._drop_prefetched = bool(self._batches.restart())

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._wrapped is not None:  # the class's own hook again
            del self._wrapped.on_train_batch_start
            self._wrapped = None
        self._close()
