"""Trainwatch in a Hugging Face `transformers.Trainer` job: a TrainerCallback.

    trainer = Trainer(model=..., args=..., callbacks=[TrainwatchCallback(job="my-run")])

Not run by Trainwatch's tests (transformers is not installed in its CI); the calls it makes
are the ones examples/train_ddp.py makes and tests/training exercises with real torchrun
jobs. HF computes the loss for logging only every `logging_steps`, so that is how often the
loss is reported; the step boundary (and so command agreement) still runs every step.
The Trainer's LambdaLR keeps base_lrs, which scale_lr scales, so a cut survives the schedule.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from exporters.training.client import TrainingMonitor


class TrainwatchCallback(TrainerCallback):
    def __init__(self, job: str | None = None, **monitor_options: Any) -> None:
        self._job = job
        self._options = monitor_options
        self.monitor: TrainingMonitor | None = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, optimizer: Any = None,
                       lr_scheduler: Any = None, **kwargs: Any) -> None:
        self.monitor = TrainingMonitor(self._job, optimizer=optimizer, scheduler=lr_scheduler,
                                       **self._options)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if self.monitor is not None and logs and "loss" in logs:
            self.monitor.report(state.global_step, loss=logs["loss"],
                                lr=logs.get("learning_rate"), grad_norm=logs.get("grad_norm"))

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.step_end(state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()
