"""Trainwatch in a Hugging Face `transformers.Trainer` job: a TrainerCallback.

    tw = HuggingFaceCallback(job="my-run", checkpoint_dir="/ckpt/my-run", save_every=500)
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

from typing import Any

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ModuleNotFoundError as exc:  # the client installs without the framework
    raise ModuleNotFoundError(
        f"HuggingFaceCallback needs transformers: pip install 'trainwatch-gpu[hf]' ({exc})",
        name=exc.name) from exc

import torch

from trainwatch.exporters.rank.framework_callbacks import FrameworkCallback


class HuggingFaceCallback(FrameworkCallback, TrainerCallback):
    """The Trainer's hooks around the shared FrameworkCallback (options, monitor, steps)."""

    def __init__(self, *args: Any, **options: Any) -> None:
        """The options of FrameworkCallback (job, checkpoint_dir, save_every, ...)."""
        super().__init__(*args, **options)
        self._hook: Any = None

    def _capture(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        """Forward hook: the loss of every training micro-batch, and the batch it came from."""
        loss = getattr(output, "loss", None)
        if not module.training or loss is None:
            return
        self._observe(loss)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, model: Any = None, optimizer: Any = None,
                       lr_scheduler: Any = None, **kwargs: Any) -> None:
        restored = self._start(model, optimizer, lr_scheduler)
        if restored is not None:
            state.global_step = restored
        self._hook = model.register_forward_hook(self._capture, with_kwargs=True)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        """After the Trainer fetched the step's micro-batches (all of them, up front)."""
        self._batch_ready()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               **kwargs: Any) -> None:
        self._after_own_work()

    def on_evaluate(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        self._after_own_work()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        self._after_own_work()

    def _after_own_work(self) -> None:
        """Logging, evaluation and saving run after on_step_end: not the loader's time."""
        if self._loading_since is not None:
            self._work_done()

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        """Once per optimizer step (after the whole accumulation window)."""
        if self.monitor is None:
            return
        result = self._step(state.global_step)
        if result.rolled_back:
            state.global_step = result.next_step - 1  # the Trainer adds one per step
            if self._batches is not None:  # drop the batch fetched ahead: a fresh iterator
                self._batches.restart()
                control.should_epoch_stop = True

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
        self._close()
