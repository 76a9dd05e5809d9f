"""Acceptance 7: the HF Trainer and Lightning callbacks of the installed client
(trainwatch.exporters.rank), with the real packages.

A tiny model the test builds itself (no downloads), CPU, gradient accumulation 2, logging
every 5 steps: every optimizer step is reported exactly once under its optimizer-step number;
checkpoints go through the CheckpointManager; a rollback command (injected at step 10 through
the monitor's command queue, as the shipper delivers it) restores the step-8 checkpoint
bit-identically and rewinds the step numbering, and the 3 batches from the one step 10
trained on go into the skip list: no batch fetched after the rollback is one of them, and the
batch the framework fetched ahead before the rollback (batch 20, in the skipped range) is
dropped, not trained on. Checkpoints are asynchronous, the default (issue 28, point 5: the
Trainer's optimizer is accelerate's wrapper, and the staging wait hooks the torch optimizer
inside it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.training.jobs.framework_worker import SlowRows
from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank.checkpoint import weights_digest

pytestmark = pytest.mark.slow


class Rows:
    """A real Forwarder: receives the rows the monitor's background thread ships."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def write(self, rows: list[tuple]) -> None:
        self.rows.extend(rows)

    def close(self) -> None:
        pass


def monitor_options(rows: Rows, job: str) -> dict[str, Any]:
    return {"rank_info": RankInfo(job, 0, 0, 1, 0), "socket_path": None, "control": False,
            "sync_every": 1, "forwarders": [rows], "flush_interval": 0.01}


LOADER_DELAY = 0.004  # seconds per row read: the loader's stopwatch (SlowRows)


def check_data_wait(rows: Rows, data: SlowRows) -> None:
    """Every second the loader took is the steps' data wait, none of it productive."""
    reported = sum(r[6] or 0.0 for r in rows.rows)  # None: no data wait reported
    assert data.seconds > 0.5
    assert abs(reported - data.seconds) <= 0.1 * data.seconds + 0.05, (reported, data.seconds)


ROLLBACK = {"id": "rb-1", "type": "rollback", "args": {"skip_batches": 3}}


def check(rows: Rows, tw: Any, fetched: list[int], digests: dict[str, str],
          trained: list[int]) -> None:
    steps = [r[0] for r in rows.rows]
    assert steps[:10] == list(range(1, 11)), steps  # every optimizer step, once each
    # after the rollback to step 8 the numbering resumes at 9, one report per optimizer step
    assert steps[10:] == list(range(9, 9 + len(steps) - 10)), steps
    rolled = [c for c in tw.controls if c.rolled_back]
    assert len(rolled) == 1
    result = rolled[0].applied[0]["result"]
    assert result["restored_step"] == 8
    assert result["skipped"] == [18, 21]  # step 10 trained on batches 18 and 19
    assert digests["restored"] == digests["saved_at_8"]
    after = fetched[fetched.index(-1) + 1:]
    assert after and not any(18 <= b < 21 for b in after), fetched
    assert after[0] == 16, "the data position of step 8 (batch 16 was fetched, not trained)"
    # The batch the framework had fetched ahead (20, chosen before the rollback and in the
    # skipped range) is dropped, not trained on: training resumes at batch 16.
    before, since = trained[:trained.index(-1)], trained[trained.index(-1) + 1:]
    assert before[-2:] == [18, 19], trained
    assert since[:4] == [16, 17, 21, 22], trained
    assert not any(18 <= b < 21 for b in since), trained


def test_hf_trainer_callback(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from trainwatch.exporters.rank import HuggingFaceCallback as TrainwatchCallback

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1,
                                     n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    data = SlowRows([{"input_ids": ids, "labels": ids}
                     for ids in torch.randint(0, 32, (256, 8))], LOADER_DELAY)
    rows, digests, fetched, trained = Rows(), {}, [], []
    first_rows = {tuple(item["input_ids"].tolist()): i for i, item in enumerate(list(data))}

    def record_batch(module, args, kwargs):  # which batch each training forward runs on
        if module.training:
            trained.append(first_rows[tuple(kwargs["input_ids"][0].tolist())] // 4)

    model.register_forward_pre_hook(record_batch, with_kwargs=True)
    tw = TrainwatchCallback(checkpoint_dir=str(tmp_path / "ckpt"), save_every=4,
                            **monitor_options(rows, "hf-job"))
    dataset = tw.batches(data, batch_size=4)
    next_batch = tw._next_batch

    def recording() -> int:
        fetched.append(next_batch())
        return fetched[-1]

    dataset._next_batch = recording

    class Inject(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 8 and "saved_at_8" not in digests:
                digests["saved_at_8"] = weights_digest(model)
            if state.global_step == 10 and not any(c.rolled_back for c in tw.controls):
                tw.monitor._incoming.append(ROLLBACK)
                fetched.append(-1)  # marks the decision: later fetches see its effect
                trained.append(-1)

    class After(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if tw.controls and tw.controls[-1].rolled_back:
                digests["restored"] = weights_digest(model)

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
        gradient_accumulation_steps=2, max_steps=16, logging_steps=5, save_strategy="no",
        report_to=[], use_cpu=True, learning_rate=1e-3, disable_tqdm=True,
        dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset,
                                   callbacks=[Inject(), tw, After()])
    trainer.train()
    # One report per optimizer step, not per logging step; the rewound global_step makes the
    # Trainer run the 2 rolled-back steps again to reach max_steps: 10 + 8.
    assert len(rows.rows) == 18
    check(rows, tw, fetched, digests, trained)
    check_data_wait(rows, data)


def test_lightning_callback(tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning")
    from torch.utils.data import DataLoader

    from trainwatch.exporters.rank import LightningCallback as TrainwatchCallback

    class Module(lightning.pytorch.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            trained.append(first_rows[tuple(x[0].tolist())] // 4)
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    torch.manual_seed(0)
    module = Module()
    data = SlowRows([(torch.randn(8), torch.randn(1)) for _ in range(256)], LOADER_DELAY)
    first_rows = {tuple(x.tolist()): i for i, (x, _) in enumerate(list(data))}
    rows, digests, fetched, trained = Rows(), {}, [], []
    tw = TrainwatchCallback(checkpoint_dir=str(tmp_path / "ckpt"), save_every=4,
                            **monitor_options(rows, "pl-job"))
    dataset = tw.batches(data, batch_size=4)
    next_batch = tw._next_batch

    def recording() -> int:
        fetched.append(next_batch())
        return fetched[-1]

    dataset._next_batch = recording

    class Inject(lightning.pytorch.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if tw.step == 8 and "saved_at_8" not in digests:
                digests["saved_at_8"] = weights_digest(pl_module)
            if tw.step == 9 and trainer.global_step == 10 and not any(
                    c.rolled_back for c in tw.controls):
                # optimizer step 10 just happened; tw reports it right after this hook
                tw.monitor._incoming.append(ROLLBACK)

    class After(lightning.pytorch.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if tw.controls and tw.controls[-1].rolled_back and "restored" not in digests:
                digests["restored"] = weights_digest(pl_module)
                fetched.append(-1)
                trained.append(-1)

    trainer = lightning.pytorch.Trainer(
        max_steps=16, accumulate_grad_batches=2, log_every_n_steps=5, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", devices=1, callbacks=[Inject(), tw, After()])
    trainer.fit(module, DataLoader(dataset, batch_size=4))
    assert len(rows.rows) == 16  # Lightning's own step count is not rewound: 16 steps in all
    check(rows, tw, fetched, digests, trained)
    check_data_wait(rows, data)
