"""Acceptance 2 and 3 on one real 2-rank gloo job (torch launches are slow here: one does both).

The job starts with no exporter listening (the node exporter is down): it must train on and
count what it could not deliver. The exporter comes up mid-run and the dropped count appears
in its metrics. At step 60 the loss turns NaN (poisoning the weights); a `rollback` command
restores the newest healthy checkpoint (step 50) on both ranks, bit-identical to the weights it
saved, skips the 7 batches from the one the NaN was first seen at (60..66, not 51..57: the
rollback goes back to step 50), and the job runs to completion with finite losses.
"""

from __future__ import annotations

import math
from pathlib import Path

from tests.support.net import free_port, wait_until
from tests.support.procs import running
from tests.training.support import JOB_BASE_ENV, events, exporter, of, torchrun, write_token
from trainwatch.exporters.contract import catalog

JOB = "rollback-job"
NAN_AT = 60
STEPS = 300


def test_nan_then_rollback_restores_healthy_checkpoint_and_outage_only_drops(
        tmp_path: Path) -> None:
    sock = tmp_path / "node.sock"
    port = free_port()
    token = write_token(tmp_path)
    checkpoints = tmp_path / "ckpt"
    env = {**JOB_BASE_ENV, catalog.ENV_JOB: JOB, catalog.ENV_EXPORTER_SOCKET: str(sock),
           catalog.ENV_SYNC_EVERY: "5"}
    args = ["--steps", str(STEPS), "--step-time", "0.03", "--nan-at-step", str(NAN_AT),
            "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "10",
            "--keep-checkpoints", "100", "--print-every", "5"]
    with running(torchrun(*args, master_port=free_port()), tmp_path / "job.log",
                 env=env) as job:
        wait_until(lambda: any(e["step"] >= 20 for e in of(events(job), "step")), timeout=120,
                   what="job training with its exporter down")
        with exporter(tmp_path, "late", socket=sock, port=port, token=token) as exp:
            dropped = wait_until(
                lambda: (d := exp.by_rank(catalog.TRAINING_DROPPED_SAMPLES, JOB)).keys()
                == {"0", "1"} and all(v > 0 for v in d.values()) and d,
                timeout=30, what="dropped samples reported by both ranks")
            wait_until(lambda: exp.by_rank(catalog.TRAINING_NONFINITE_LOSS, JOB).get("0", 0) > 0,
                       timeout=60, what="non-finite loss counted")
            posted = exp.api("POST", f"/v1/jobs/{JOB}/commands",
                             json={"id": "rb-1", "type": "rollback", "args": {"skip_batches": 7}})
            assert posted.status_code == 202, posted.text
            wait_until(lambda: not job.alive(), timeout=120, what="job finished")
            assert job.proc.returncode == 0, job.log_text()[-3000:]
            wait_until(lambda: exp.by_rank(catalog.TRAINING_ROLLBACKS, JOB) == {"0": 1.0, "1": 1.0},
                       timeout=10, what="rollbacks exported")
            ranks = exp.api("GET", f"/v1/jobs/{JOB}/commands/rb-1").json()["ranks"]
            found = events(job)

    applied = of(found, "command_applied", id="rb-1")
    assert {e["rank"] for e in applied} == {0, 1} and len(applied) == 2
    assert all(e["status"] == "applied" for e in applied)
    step = applied[0]["step"]
    assert applied[1]["step"] == step > NAN_AT
    assert ranks == {"0": {"status": "applied", "step": step},
                     "1": {"status": "applied", "step": step}}
    restored = {e["result"]["restored_step"] for e in applied}
    assert restored == {NAN_AT - 10}, "newest healthy checkpoint is the one before the NaN"

    # Bit-identical: the restored weights on both ranks equal the model's when it was saved.
    saved_event = of(found, "checkpoint_saved", rank=0, step=NAN_AT - 10)
    assert {e["weights_sha256"] for e in applied} == {saved_event[0]["weights_sha256"]}
    assert all(e["result"]["skipped"] == [NAN_AT, NAN_AT + 7] for e in applied)
    # The batches read after the rollback: from the checkpoint's position, past the window.
    after = [e["batch"] for e in of(found, "step", rank=0) if e["time"] > applied[0]["time"]]
    assert after and not any(NAN_AT <= b < NAN_AT + 7 for b in after)

    summaries = of(found, "summary")
    assert len(summaries) == 2
    for summary in summaries:
        assert summary["final_step"] == STEPS - 1
        assert math.isfinite(summary["final_loss"])  # finite again after the rollback
        assert summary["skip"] == [[NAN_AT, NAN_AT + 7]]
        assert summary["rollbacks"] == 1
        assert summary["dropped"] >= dropped[str(summary["rank"])] > 0
        assert summary["nonfinite"] >= 1
    assert len({s["weights_sha256"] for s in summaries}) == 1
