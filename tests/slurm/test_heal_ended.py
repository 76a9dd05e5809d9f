"""Faults that end the job before any alert: a 2-node `sbatch` job (srun starts torchrun on
each node, c10d, gloo, srun's kill-on-bad-exit) loses a rank, and the batch job is FAILED
within seconds. Without a human the job trains again from its newest committed checkpoint,
its parameters equal a reference restore of that checkpoint:

* a rank SIGKILLed (TrainingJobVanished names it): the ended job is requeued by its Slurm id,
  no node is drained;
* a fatal XID whose rank dies with it (GpuXidErrors 48 on the rank's node): that node is
  drained once and the ended job runs again on the healthy node and the spare;
* a rank that raises (every rank reports its own error, the alert names no rank): no
  requeue, no drain.

The alerts are posted to the service as Alertmanager delivers them; the whole path from the
exporters through Prometheus and Alertmanager is tests/slurm/test_heal_pipeline.py.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.remediation.helpers import REPO, alert
from tests.slurm.cluster import SlurmCluster
from tests.slurm.fixtures import drains, job_nodes, requeues, scontrol_calls
from tests.slurm.test_heal_e2e import assert_resumed, events, of
from tests.slurm.test_quarantine import NODE_HOST, deliver, running_on, services
from tests.support.net import free_port, wait_until

pytestmark = pytest.mark.slow
PLAYBOOKS = REPO / "remediation" / "playbooks"


def book(name: str) -> dict[str, Any]:
    """A shipped playbook, as the service loads it."""
    doc: dict[str, Any] = yaml.safe_load((PLAYBOOKS / f"{name}.yaml").read_text())
    return doc


def job_script(out: Path, ckpt: Path, port: int, *, raise_at: int | None = None) -> str:
    """sbatch script: one torchrun agent per node through srun, the ranks naming their job by
    its Slurm id (TRAINWATCH_JOB, as `--rdzv-id=$SLURM_JOB_ID` would)."""
    train = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
             "--rdzv-id=ended-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}",
             str(REPO / "examples" / "train_ddp.py"), "--steps", "100000",
             "--step-time", "0.1", "--print-every", "1", "--checkpoint-dir", str(ckpt),
             "--checkpoint-every", "5", "--keep-checkpoints", "1000", "--sync-checkpoints"]
    return "\n".join([
        "#!/bin/bash",
        "#SBATCH --nodes=2 --requeue --open-mode=append",
        f"#SBATCH --output={out}",
        "export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 TRAINWATCH_JOB=$SLURM_JOB_ID",
        "echo '{\"event\": \"incarnation\", \"restart_count\": '${SLURM_RESTART_COUNT:-0}', "
        "\"time\": '$(date +%s.%N)', \"nodes\": \"'$SLURM_JOB_NODELIST'\"}'",
        "exec srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 " + " ".join(train),
        ""])


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1)
                for item in raw.split(b"\0") if b"=" in item)


def of_cluster(env: dict[str, str], slurm: SlurmCluster) -> bool:
    """A process of `slurm`'s jobs: another test worker's cluster numbers its jobs from 1
    too, so a job id alone may name that cluster's job."""
    return env.get("SLURM_CONF") == str(slurm.conf)


def rank_process(slurm: SlurmCluster, job: str, rank: int) -> tuple[int, str]:
    """(pid, Slurm node) of the torchrun worker that is `rank` of Slurm job `job`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        env = environ(int(entry.name))
        if (env.get("SLURM_JOB_ID") == job and env.get("RANK") == str(rank)
                and env.get("TORCHELASTIC_ERROR_FILE") and of_cluster(env, slurm)):
            return int(entry.name), env["SLURMD_NODENAME"]
    raise LookupError(f"no rank {rank} of job {job}")


def start_job(slurm: SlurmCluster, tmp_path: Path) -> tuple[str, Path, Path, list[str]]:
    out, ckpt = tmp_path / "job.out", tmp_path / "ckpt"
    script = tmp_path / "job.sh"
    script.write_text(job_script(out, ckpt, free_port()))
    submitted = slurm.run(["sbatch", "--parsable", f"--chdir={tmp_path}", str(script)])
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    first = running_on(slurm, job)
    assert len(first) == 2
    wait_until(lambda: len({e["step"] for e in of(events(out), "checkpoint_saved")}) >= 2,
               timeout=180, interval=0.5, what="two committed checkpoints")
    return job, out, ckpt, first


def kill_rank(slurm: SlurmCluster, job: str, rank: int) -> str:
    """SIGKILL one rank; wait until Slurm has ended the job (srun's kill-on-bad-exit)."""
    pid, node = wait_until(lambda: _find(slurm, job, rank), timeout=30,
                           what=f"rank {rank}'s process")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: job_nodes(slurm, job)[0] not in ("RUNNING", "CONFIGURING"),
               timeout=60, interval=0.2, what="the job ended by the kill")
    return node


def _find(slurm: SlurmCluster, job: str, rank: int) -> tuple[int, str] | None:
    try:
        return rank_process(slurm, job, rank)
    except LookupError:
        return None


def test_killed_rank_requeues_the_ended_job_by_its_id_and_drains_nothing(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    job, out, ckpt, _ = start_job(slurm, tmp_path)
    with services(tmp_path, slurm, [book("job_restart")]) as (svcs, log, _pager):
        node = kill_rank(slurm, job, 1)
        deliver(svcs[0], alert("TrainingJobVanished", {
            "training_job": job, "rank": "1", "node": NODE_HOST[node],
            "severity": "critical", "component": "training"}))
        svcs[0].wait_idle(120)
        [acted] = svcs[0].audit("acted")
        assert acted["target_key"] == f"training_job={job}"
        assert requeues(log) == [["requeue", job]] and drains(log) == []
    assert_resumed(slurm, job, out, ckpt)
    assert all(slurm.node_state(n) in ("idle", "allocated") for n in slurm.nodes)


def test_fatal_xid_that_killed_its_rank_drains_that_node_once_and_brings_the_job_back(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    job, out, ckpt, first = start_job(slurm, tmp_path)
    with services(tmp_path, slurm, [book("node_quarantine")],
                  min_healthy_fraction=0.5) as (svcs, log, _pager):
        node = kill_rank(slurm, job, 1)  # as XID 48 takes the CUDA process with it
        gpu = {"node": NODE_HOST[node], "gpu": "0", "severity": "critical", "component": "gpu"}
        deliver(svcs[0], alert("GpuXidErrors", {"xid": "48", **gpu}))
        deliver(svcs[0], alert("GpuEccUncorrectableErrors", gpu))
        svcs[0].wait_idle(120)
        assert len(svcs[0].audit("acted")) == 1
        assert len(drains(log)) == 1 and requeues(log) == [["requeue", job]]
        assert [c for c in scontrol_calls(log) if c[0] == "update" and "NodeName" in c[1]
                and node not in c[1]] == []
    assert slurm.node_state(node) in ("drained", "draining")
    second = assert_resumed(slurm, job, out, ckpt)
    assert node not in second and set(first) - {node} <= set(second)


def test_rank_that_raised_is_not_restarted_and_drains_nothing(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """Every rank reported its own error, so the alert names no rank: not restarted (decided
    before any scheduler command, so the job needs no record here; a FAILED record left
    behind would be another test's ended job on that node)."""
    job = "4242"
    with services(tmp_path, slurm, [book("job_restart")]) as (svcs, log, _pager):
        deliver(svcs[0], alert("TrainingJobVanished", {
            "training_job": job, "severity": "critical", "component": "training"}))
        svcs[0].wait_idle(60)
        [decided] = svcs[0].audit()
        assert decided["decision"] == "not_actionable"
        assert requeues(log) == [] and drains(log) == []
