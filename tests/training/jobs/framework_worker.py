"""A real Hugging Face Trainer or Lightning run with a slow loader, reporting through the
installed callback to the exporter its environment names (TRAINWATCH_*): the goodput tests'
framework job (issue 37, shape 3). CPU, one process, a model it builds itself (no downloads).

Prints JSON events with its own clocks: `start` (its pid, for the test to read the process's
start from /proc), `step` after every optimizer step (the loader's seconds so far), `closed`
once the trainer returned (the callback closed its monitor at the end of training).

    python framework_worker.py hf|lightning [--steps 50] [--delay 0.05]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields, "wall": time.time()}) + "\n")
    sys.stdout.flush()


class SlowRows(list):
    """The training rows, each read in `delay` seconds: the loader's own stopwatch."""

    def __init__(self, rows: list[Any], delay: float) -> None:
        super().__init__(rows)
        self.delay = delay
        self.seconds = 0.0

    def __getitem__(self, index: Any) -> Any:
        began = time.perf_counter()
        time.sleep(self.delay)
        item = super().__getitem__(index)
        self.seconds += time.perf_counter() - began
        return item


def hugging_face(steps: int, delay: float) -> None:
    import transformers

    from trainwatch.exporters.rank import HuggingFaceCallback

    config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1,
                                     n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    data = SlowRows([{"input_ids": ids, "labels": ids}
                     for ids in torch.randint(0, 32, (4 * steps + 8, 8))], delay)
    tw = HuggingFaceCallback()

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            emit("step", step=state.global_step, loader=data.seconds)

    args = transformers.TrainingArguments(
        output_dir=os.environ.get("TMPDIR", "/tmp"), per_device_train_batch_size=4,
        max_steps=steps, logging_steps=1000, save_strategy="no", report_to=[], use_cpu=True,
        learning_rate=1e-3, disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=tw.batches(data, 4),
                                   callbacks=[tw, Clock()])
    trainer.train()


def lightning_run(steps: int, delay: float) -> None:
    import lightning
    from torch.utils.data import DataLoader

    from trainwatch.exporters.rank import LightningCallback

    class Module(lightning.pytorch.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    data = SlowRows([(torch.randn(8), torch.randn(1)) for _ in range(4 * steps + 8)], delay)
    tw = LightningCallback()

    class Clock(lightning.pytorch.Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            emit("step", step=trainer.global_step, loader=data.seconds)

    trainer = lightning.pytorch.Trainer(
        max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=1, callbacks=[tw, Clock()])
    trainer.fit(Module(), DataLoader(tw.batches(data, 4), batch_size=4))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=("hf", "lightning"))
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--delay", type=float, default=0.05)
    args = parser.parse_args()
    emit("start", pid=os.getpid())
    torch.manual_seed(0)
    (hugging_face if args.framework == "hf" else lightning_run)(args.steps, args.delay)
    emit("closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
