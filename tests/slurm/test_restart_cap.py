"""A job that keeps dying is restarted at most N times per window (default 3 per hour), then
the on-call is paged: a 2-node batch job on the Slurm test cluster has a rank killed four
times, each time TrainingJobVanished names the killed rank; the ended job is requeued three
times, the fourth time it stays down and the pager hears about it."""

from __future__ import annotations

import os
import signal
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.remediation.helpers import alert
from tests.slurm.cluster import SlurmCluster
from tests.slurm.fixtures import job_nodes, requeues
from tests.slurm.test_heal_ended import book, environ, of_cluster
from tests.slurm.test_quarantine import NODE_HOST, deliver, running_on, services
from tests.support.net import wait_until

pytestmark = pytest.mark.slow


def task_of(slurm: SlurmCluster, job: str, restarts: int) -> tuple[int, str] | None:
    """(pid, node) of one task srun started for `job` (a `sleep`) in its incarnation after
    `restarts` requeues, if one runs (a task of the incarnation before may still be ending
    on a loaded machine: killing it would end nothing)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            env = environ(int(entry.name))
            if env.get("SLURM_JOB_ID") == job and env.get("SLURM_STEP_ID") == "0" \
                    and env.get("SLURM_PROCID") == "1" \
                    and env.get("SLURM_RESTART_COUNT", "0") == str(restarts) \
                    and of_cluster(env, slurm):
                return int(entry.name), env["SLURMD_NODENAME"]
    return None


def test_a_job_killed_four_times_in_an_hour_is_restarted_three_times_then_paged(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    submitted = slurm.run(["sbatch", "--parsable", "--requeue", "--nodes=2",
                           f"--output={tmp_path}/job.out", "--wrap",
                           "exec srun --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=1 "
                           "sleep 600"])
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    try:
        with services(tmp_path, slurm, [book("job_restart")],
                      min_healthy_fraction=0.0) as (svcs, log, pager):
            for kill in range(4):
                running_on(slurm, job, timeout=60)
                pid, node = wait_until(lambda kill=kill: task_of(slurm, job, kill), timeout=30,
                                       what="a task of the job's incarnation")
                killed_at = datetime.now(timezone.utc)  # the alert starts at the death
                os.kill(pid, signal.SIGKILL)
                wait_until(lambda: job_nodes(slurm, job)[0] not in ("RUNNING", "CONFIGURING"),
                           timeout=60, interval=0.2, what="the job ended by the kill")
                starts = killed_at.isoformat().replace("+00:00", "Z")
                deliver(svcs[0], alert("TrainingJobVanished", {
                    "training_job": job, "rank": "1", "node": NODE_HOST[node],
                    "severity": "critical", "component": "training"}, starts_at=starts))
                svcs[0].wait_idle(90)
                if kill < 3:
                    assert len(requeues(log)) == kill + 1
            assert len(requeues(log)) == 3, "the fourth death is not restarted"
            assert job_nodes(slurm, job)[0] in ("", "FAILED", "COMPLETING")
            decisions = [a["decision"] for a in svcs[0].audit() if a["playbook"] == "job_restart"]
            assert decisions.count("acted") == 3 and len(decisions) == 4
            pages = [r for r in pager.posts() if job in str(r.body)]
            assert pages, "the on-call is paged about the job that keeps dying"
    finally:
        # leave no FAILED record behind: it would be an ended job on its nodes for the next
        # test (a finished job cannot be cancelled, only requeued first)
        slurm.run(["scontrol", "requeue", job])
        slurm.run(["scancel", job])
