"""Issue 23, acceptance 1 (the job side, end to end on the Slurm test cluster): a 2-node job
submitted with sbatch (srun starts torchrun on each node, c10d rendezvous, gloo) loses a GPU on
one node: XID 79, then GpuLost, each delivered by both Alertmanagers to both remediation
replicas. Without a human the node is drained with a reason naming the alert and intent, the
job is requeued, it resumes on the two healthy nodes (one the spare) from its newest committed
checkpoint, and its steps go on; every rank's parameters after the resume equal those of a
reference restored from the same checkpoint; scontrol drained once and requeued once.

The alerts are posted as Alertmanager posts them (tests/slurm/test_quarantine.py covers the
rails); the rule and Alertmanager path from the fake NVML to the webhook is the existing
stack's (tests/e2e).
"""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests
import torch
from torch import nn

from tests.remediation.helpers import REPO, TOKEN, auth, stub_server
from tests.remediation.processes import service_config, start_service
from tests.slurm.cluster import SlurmCluster
from tests.slurm.fixtures import drains, job_nodes, quarantine_book, requeues, service_overrides
from tests.slurm.test_quarantine import NODE_HOST, running_on
from tests.support.alertmanager_config import render_one
from tests.support.net import free_port, wait_until
from tests.support.procs import alertmanager
from tests.training.support import events_in, of
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.rank.checkpoint import MANIFEST, CheckpointManager, weights_digest

FEATURES = 16  # examples/train_ddp.py's model
JOB = "heal-e2e"


def job_script(out: Path, ckpt: Path, port: int) -> str:
    """sbatch script: one torchrun agent per node through srun, c10d rendezvous on loopback
    (every test node is this machine), a fresh rendezvous id per incarnation."""
    train = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
             "--rdzv-id=heal-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}",
             str(REPO / "examples" / "train_ddp.py"), "--job", JOB, "--steps", "100000",
             "--step-time", "0.1", "--print-every", "1", "--checkpoint-dir", str(ckpt),
             "--checkpoint-every", "5", "--keep-checkpoints", "1000", "--sync-checkpoints"]
    return "\n".join([
        "#!/bin/bash",
        "#SBATCH --nodes=2 --requeue --open-mode=append",
        f"#SBATCH --output={out}",
        "export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1",
        "echo '{\"event\": \"incarnation\", \"restart_count\": '${SLURM_RESTART_COUNT:-0}', "
        "\"time\": '$(date +%s.%N)', \"nodes\": \"'$SLURM_JOB_NODELIST'\"}'",
        "exec srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 " + " ".join(train),
        ""])


def events(out: Path) -> list[dict[str, Any]]:
    """The JSON event lines a job wrote to its Slurm output file so far."""
    return events_in(out.read_text(errors="replace")) if out.exists() else []


def newest_committed_before(ckpt: Path, step: int) -> int:
    """The newest checkpoint the manifest lists below `step`: the new incarnation writes only
    from the step it resumed at, so this is the newest the old one committed (a checkpoint
    committed just before the requeue killed its ranks may never have been announced on
    stdout, so the manifest, not the events, is the record)."""
    manifest = json.loads((ckpt / MANIFEST).read_text())["checkpoints"]
    return max(e["step"] for e in manifest if e["step"] < step)


def reference_digest(ckpt: Path, step: int) -> str:
    """The weights a fresh single process restores from the checkpoint of `step`."""
    torch.manual_seed(0)  # different initial weights: only the restore can make them equal
    net = nn.Sequential(nn.Linear(FEATURES, 64), nn.LeakyReLU(0.1), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    manager = CheckpointManager(ckpt, net, optimizer, keep=1000, asynchronous=False)
    try:
        restored = manager.rollback(before_step=step + 1)
        assert restored.step == step
        return weights_digest(net)
    finally:
        manager.close()


def test_lost_gpu_node_drained_job_requeued_and_resumed_from_checkpoint(
        slurm: SlurmCluster, tmp_path: Path) -> None:
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
    bad = first[0]
    host = NODE_HOST[bad]
    gpu = {"node": host, "gpu": "0", "uuid": "GPU-fake-0", "name": "Fake H100",
           "severity": "critical", "component": "gpu"}
    with ExitStack() as stack:
        pager, _ = stack.enter_context(stub_server())
        overrides, log = service_overrides(tmp_path, slurm, pager, min_healthy_fraction=0.5)
        ports = [free_port(), free_port()]
        replicas = [stack.enter_context(start_service(service_config(
            tmp_path / f"replica{i}", [quarantine_book()], port=port,
            store_path=str(tmp_path / "shared.sqlite"), **overrides), port,
            log_name=f"replica{i}.log")) for i, port in enumerate(ports)]
        token = tmp_path / "webhook.token"
        token.write_text(TOKEN)
        am_config = render_one({
            "alertmanager_remediation_urls": [f"{r.url}/v1/alerts" for r in replicas],
            "alertmanager_remediation_token_file": str(token),
            "alertmanager_group_wait": "1s", "alertmanager_group_interval": "1s",
            "alertmanager_repeat_interval": "1h"}, tmp_path / "am-render")
        ams = [stack.enter_context(alertmanager(tmp_path / f"am{i}", am_config))
               for i in range(2)]
        starts = datetime.now(timezone.utc).isoformat()
        for labels in ({"alertname": "GpuXidErrors", "xid": "79", **gpu},
                       {"alertname": "GpuLost", **gpu}):
            for am in ams:  # Prometheus sends every alert to each Alertmanager
                resp = requests.post(f"{am}/api/v2/alerts", timeout=5, json=[{
                    "labels": labels, "startsAt": starts, "annotations": {"summary": "e2e"},
                    "generatorURL": "http://prometheus.test/graph"}])
                assert resp.status_code == 200, resp.text

        def received(replica: Any) -> float:
            """Alerts this replica's process took in (its own counter, every outcome)."""
            text = requests.get(f"{replica.url}/metrics", headers=auth(), timeout=5).text
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(f"{catalog.REMEDIATION_WEBHOOK_ALERTS}{{"))

        # each Alertmanager delivers both alerts to each replica
        wait_until(lambda: all(received(r) >= 4 for r in replicas), timeout=60,
                   what="both replicas received both alerts from both Alertmanagers")
        acted = wait_until(lambda: [a for a in replicas[0].actions()["audit"]
                                    if a["decision"] == "acted"], timeout=120,
                           what="the quarantine acted")[0]
        wait_until(lambda: not replicas[0].actions(state="pending")["actions"]
                   and not replicas[0].actions(state="running")["actions"], timeout=120,
                   what="every intent processed")
        assert len(drains(log)) == 1 and len(requeues(log)) == 1
        decisions = [a["decision"] for a in replicas[1].actions()["audit"]]
        assert decisions.count("acted") == 1 and "already_quarantined" in decisions
    # whichever of the two alerts a worker took first names the drain
    named = "GpuXidErrors XID 79" if acted["alertname"] == "GpuXidErrors" else "GpuLost"
    assert slurm.node_reason(bad) == (
        f"trainwatch: {named} intent {acted['intent_id']}: quarantine (hardware), job "
        "requeued, resume after node_health_check")
    # the new incarnation: on the two healthy nodes, resumed from the newest committed
    # checkpoint, and stepping on
    second = assert_resumed(slurm, job, out, ckpt)
    assert bad not in second and len(second) == 2


def assert_resumed(slurm: SlurmCluster, job: str, out: Path, ckpt: Path) -> list[str]:
    """The new incarnation runs, resumed on both ranks from the newest committed checkpoint,
    steps on, and its weights equal a reference restore; the nodes it runs on."""
    second = running_on(slurm, job, timeout=120)
    resumed = wait_until(lambda: (lambda r: r if len(r) == 2 else None)(
        of(events(out), "resumed")), timeout=180, interval=0.5, what="both ranks resumed")
    step = resumed[0]["step"]
    assert {r["step"] for r in resumed} == {step}
    wait_until(lambda: any(e["step"] >= step + 3 for e in of(events(out), "step")
                           if e["time"] > resumed[0]["time"]), timeout=120, interval=0.5,
               what="steps after the resume")
    assert step - 1 == newest_committed_before(ckpt, step), (
        "resumed from the newest committed checkpoint")
    assert of(events(out), "incarnation", restart_count=1)
    slurm.run(["scancel", job])
    wait_until(lambda: job_nodes(slurm, job)[0] == "", timeout=60, what="job gone")
    assert {r["weights_sha256"] for r in resumed} == {reference_digest(ckpt, step - 1)}
    return second
