"""Acceptance 1 on real jobs (CPU, gloo, torchrun): 4-rank FSDP2 and 2-rank DDP, across a restart.

Batch 33 is poisoned (its loss is NaN, which poisons the weights). When the exporter shows
the non-finite loss, the test cuts the LR (a `scale_lr` command, applied on every rank) and
then posts a `rollback` skipping 3 batches. The job restores the newest healthy checkpoint
(step 30) on every rank, each rank's shards bit-identical to what it saved, and then crashes
(`--crash-after-rollback`) before its next checkpoint; torchrun restarts the worker group in
place (`--max-restarts 1`) and every rank resumes from step 30 again. The LR cut is still in
force after the rollback and after the restart, the cut is not applied a second time, and
batches 33-35 are never read again.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.support.net import wait_until
from tests.support.procs import running
from tests.training.support import (
    ELASTIC_ENV,
    EXAMPLE,
    JOB_BASE_ENV,
    elastic_torchrun,
    events,
    exporter,
    of,
)
from trainwatch.exporters.contract import catalog

pytestmark = pytest.mark.slow
JOB = "sharded-job"
POISON = 33


@pytest.mark.parametrize(("model", "RANKS"), [("fsdp", 4), ("ddp", 2)])
def test_rollback_restores_shards_skips_poison_and_keeps_lr_cut_across_restart(
        tmp_path: Path, model: str, RANKS: int) -> None:
    checkpoints = tmp_path / "ckpt"
    args = ["--model", model, "--steps", "300", "--step-time", "0.02",
            "--poison-batches", str(POISON), "--checkpoint-dir", str(checkpoints),
            "--checkpoint-every", "10", "--keep-checkpoints", "100", "--print-every", "1",
            "--crash-after-rollback"]
    with exporter(tmp_path) as exp:
        env = {**JOB_BASE_ENV, **exp.job_env(JOB), catalog.ENV_SYNC_EVERY: "5"}
        env = {**env, **ELASTIC_ENV}
        argv = elastic_torchrun(EXAMPLE, *args, nproc=RANKS, max_restarts=1)
        with running(argv, tmp_path / "job.log", env=env) as job:
            wait_until(lambda: exp.by_rank(catalog.TRAINING_NONFINITE_LOSS, JOB).get("0", 0) > 0,
                       timeout=180, what="non-finite loss exported")
            posted = exp.api("POST", f"/v1/jobs/{JOB}/commands",
                             json={"id": "cut-1", "type": "scale_lr", "args": {"factor": 0.5}})
            assert posted.status_code == 202, posted.text
            wait_until(lambda: exp.api("GET", f"/v1/jobs/{JOB}/commands/cut-1").json()["status"]
                       == "applied", timeout=60, what="LR cut applied on every rank")
            posted = exp.api("POST", f"/v1/jobs/{JOB}/commands",
                             json={"id": "rb-1", "type": "rollback", "args": {"skip_batches": 3}})
            assert posted.status_code == 202, posted.text
            # Every rank exits 1 right after the rollback; torchrun restarts them in place.
            wait_until(lambda: not job.alive(), timeout=300, what="restarted job finished")
            assert job.proc.returncode == 0, job.log_text()[-4000:]
            found = events(job)

    cuts = of(found, "command_applied", id="cut-1")
    assert len(cuts) == RANKS and {e["lr"] for e in cuts} == {0.025}, "applied exactly once"
    rollbacks = of(found, "command_applied", id="rb-1")
    assert len(rollbacks) == RANKS and {e["status"] for e in rollbacks} == {"applied"}
    assert len({e["step"] for e in rollbacks}) == 1
    assert all(e["result"]["restored_step"] == 30 for e in rollbacks)
    assert all(e["result"]["skipped"] == [POISON, POISON + 3] for e in rollbacks)
    assert {e["lr"] for e in rollbacks} == {0.025}, "the cut survives the rollback"

    resumed = of(found, "resumed")
    assert len(resumed) == RANKS, "every rank of the restarted job resumed"
    starts = sorted(e["restarts"] for e in of(found, "start"))
    assert starts == [0] * RANKS + [1] * RANKS, "torchrun's own in-place restart"
    for rank in range(RANKS):
        saved = of(found, "checkpoint_saved", rank=rank, step=30)[0]
        rolled = of(rollbacks, "command_applied", rank=rank)[0]
        again = of(resumed, "resumed", rank=rank)[0]
        assert rolled["shard_sha256"] == again["shard_sha256"] == saved["shard_sha256"]
        assert rolled["weights_sha256"] == saved["weights_sha256"]
        assert again["step"] == 31 and again["lr"] == 0.025
        assert again["skip"] == [[POISON, POISON + 3]]
        poison_reads = of(found, "poison_read", rank=rank)
        assert poison_reads and all(p["time"] < rolled["time"] for p in poison_reads), \
            "the poisoned batch is never read again (neither after rollback nor restart)"
        after = [e["batch"] for e in of(found, "step", rank=rank) if e["time"] > again["time"]]
        assert after[:3] == [31, 32, POISON + 3]

    summaries = of(found, "summary")
    assert len(summaries) == RANKS
    assert len({s["weights_sha256"] for s in summaries}) == 1
    for summary in summaries:
        assert summary["final_step"] == 299 and math.isfinite(summary["final_loss"])
        assert summary["lr"] == 0.025 and summary["failed_saves"] == 0
