"""Acceptance 1 (and 4 on a live job): a real 2-rank gloo job spread over two simulated nodes.

Each "node" is its own torchrun agent (static rendezvous on loopback, one rank each) with its
own real training-exporter (own socket and port), exactly as two GPU hosts would run. The
command is posted to node A only, at a random step: rank 1 can learn it only through the
in-band agreement, and both ranks must apply it at the same step.
"""

from __future__ import annotations

import random
from pathlib import Path

from tests.support.net import free_port, wait_until
from tests.support.procs import running
from tests.training.support import JOB_BASE_ENV, Exporter, events, exporter, of, torchrun
from trainwatch.exporters.contract import catalog

JOB = "two-nodes"
SYNC_EVERY = 5
BASE_LR = 0.05


def test_command_posted_to_one_node_is_applied_by_both_ranks_at_the_same_step(
        tmp_path: Path) -> None:
    target = random.randint(5, 60)  # the random moment: the step node A has reached
    args = ["--job", JOB, "--steps", "150", "--step-time", "0.03", "--print-every", "1",
            "--lr", str(BASE_LR)]
    port = free_port()
    with exporter(tmp_path, "node-a", node="node-a") as a, \
            exporter(tmp_path, "node-b", node="node-b") as b:
        env = {**JOB_BASE_ENV, catalog.ENV_SYNC_EVERY: str(SYNC_EVERY)}
        with running(torchrun(*args, nproc=1, nnodes=2, node_rank=0, master_port=port),
                     tmp_path / "node-a-job.log", env={**env, **a.job_env(JOB)}) as job_a, \
                running(torchrun(*args, nproc=1, nnodes=2, node_rank=1, master_port=port),
                        tmp_path / "node-b-job.log", env={**env, **b.job_env(JOB)}) as job_b:
            wait_until(lambda: a.by_rank(catalog.TRAINING_STEP, JOB).get("0", -1) >= target,
                       timeout=120, interval=0.02, what=f"rank 0 at step {target}")
            # Bad commands against the live job: refused, and (checked below) nothing changed.
            for bad in ({"type": "scale_lr", "args": {"factor": 0}},
                        {"type": "scale_lr", "args": {"factor": 2}},
                        {"type": "reboot_node"}):
                assert a.api("POST", f"/v1/jobs/{JOB}/commands", json=bad).status_code == 400
            assert a.api("POST", f"/v1/jobs/{JOB}/commands", token=None,
                         json={"type": "scale_lr", "args": {"factor": 0.5}}).status_code == 401
            assert a.api("POST", "/v1/jobs/other-job/commands",
                         json={"type": "scale_lr", "args": {"factor": 0.5}}).status_code == 404
            posted = a.api("POST", f"/v1/jobs/{JOB}/commands",
                           json={"id": "cut-1", "type": "scale_lr", "args": {"factor": 0.1}})
            assert posted.status_code == 202, posted.text
            for job in (job_a, job_b):
                wait_until(lambda job=job: not job.alive(), timeout=120, what="job finished")
                assert job.proc.returncode == 0, job.log_text()[-3000:]

            # Per-rank status: node A saw rank 0 apply it; node B learned the command from
            # rank 1's report although nobody posted it there.
            def status(exp: Exporter, rank: str) -> dict | None:
                ranks = exp.api("GET", f"/v1/jobs/{JOB}/commands/cut-1").json()["ranks"]
                return ranks.get(rank) if (ranks.get(rank) or {}).get("step") is not None else None

            applied_a = wait_until(lambda: status(a, "0"), timeout=10, what="rank 0 on node A")
            applied_b = wait_until(lambda: status(b, "1"), timeout=10, what="rank 1 on node B")
            rank0, rank1 = events(job_a), events(job_b)

    applied0 = of(rank0, "command_applied", id="cut-1")
    applied1 = of(rank1, "command_applied", id="cut-1")
    assert len(applied0) == len(applied1) == 1
    step = applied0[0]["step"]
    assert applied1[0]["step"] == step, "both ranks apply at the same step"
    assert step % SYNC_EVERY == 0 and step >= target
    assert applied_a == {"status": "applied", "step": step}
    assert applied_b == {"status": "applied", "step": step}
    assert applied0[0]["lr"] == applied1[0]["lr"] == BASE_LR * 0.1

    lr0 = {e["step"]: e["lr"] for e in of(rank0, "step")}
    lr1 = {e["step"]: e["lr"] for e in of(rank1, "step")}
    assert lr0 == lr1 and len(lr0) == 150, "identical LR on both ranks at every step"
    assert {lr for s, lr in lr0.items() if s <= step} == {BASE_LR}, "bad commands changed nothing"
    assert {lr for s, lr in lr0.items() if s > step} == {BASE_LR * 0.1}
    summaries = of(rank0, "summary") + of(rank1, "summary")
    assert len({s["weights_sha256"] for s in summaries}) == 1, "replicas still identical"
    assert all(s["applied"] == {"scale_lr": 1} for s in summaries)
