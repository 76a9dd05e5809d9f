"""Issue 23, acceptance 4: the same fault without a scheduler. A torchrun elastic job
(`--nnodes=1:2`, c10d) runs on two loopback "hosts" (each its own agent and real training
exporter); GpuLost on node-b makes the quarantine action stop node-b's agent through Ansible
on exactly that host, and the job goes on on node-a alone, resharded from its newest committed
checkpoint (weights equal a reference restore of that checkpoint)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from tests.remediation.conftest import make_service
from tests.remediation.helpers import REPO, alert
from tests.slurm.fixtures import quarantine_book
from tests.slurm.test_heal_e2e import events, newest_committed_before, of, reference_digest
from tests.slurm.test_quarantine import deliver
from tests.support.net import free_port, wait_until
from tests.support.procs import ManagedProcess
from tests.training.support import ELASTIC_ENV, exporter

JOB = "elastic-heal"


def agent(port: int, ckpt: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2",
            "--nproc-per-node=1", "--max-restarts=3", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={JOB}",
            "--rdzv-conf=last_call_timeout=2", str(REPO / "examples" / "train_ddp.py"),
            "--job", JOB, "--steps", "100000", "--step-time", "0.1", "--print-every", "1",
            "--checkpoint-dir", str(ckpt), "--checkpoint-every", "5", "--keep-checkpoints",
            "1000", "--sync-checkpoints"]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_stopping_the_faulty_nodes_agent_leaves_the_job_running_resharded(
        tmp_path: Path) -> None:
    ckpt, port = tmp_path / "ckpt", free_port()
    with exporter(tmp_path, "node-a", node="node-a") as exp_a, \
            exporter(tmp_path, "node-b", node="node-b") as exp_b:
        inventory = tmp_path / "hosts.yml"
        inventory.write_text("all:\n  hosts:\n" + "".join(
            f"    {host}:\n      ansible_connection: local\n"
            f"      ansible_python_interpreter: {sys.executable}\n"
            f"      trainwatch_python: {sys.executable}\n"
            f"      scheduler_node_name: {host}\n"
            f"      trainwatch_exporter_socket: {exp.socket}\n"
            for host, exp in (("node-a", exp_a), ("node-b", exp_b))))
        a = ManagedProcess(agent(port, ckpt), tmp_path / "agent-a.log",
                           env={**ELASTIC_ENV, **exp_a.job_env(JOB)})
        b = None
        try:
            # node-a's agent hosts the rendezvous store: it must outlive node-b's
            wait_until(lambda: listening(port), timeout=60, what="node-a's rendezvous store")
            b = ManagedProcess(agent(port, ckpt), tmp_path / "agent-b.log",
                               env={**ELASTIC_ENV, **exp_b.job_env(JOB)})
            wait_until(lambda: len({e["step"] for e in of(events(a.log_path),
                                                               "checkpoint_saved")}) >= 2,
                       timeout=240, interval=0.5, what="two checkpoints at world size 2")
            assert of(events(a.log_path), "start", world_size=2)
            with make_service(tmp_path / "svc", [quarantine_book()], ansible_inventory=str(
                    inventory), scheduler={"kind": "torchrun_elastic",
                                           "min_healthy_fraction": 0.5}) as svc:
                deliver(svc, alert("GpuLost", {"node": "node-b", "gpu": "0"}))
                svc.wait_idle(120)
                [acted] = svc.audit("acted")
                assert acted["target_key"] == "node=node-b"
            wait_until(lambda: not b.alive(), timeout=60, what="node-b's agent stopped")
            resumed = wait_until(lambda: of(events(a.log_path), "resumed"), timeout=240,
                                 interval=0.5, what="node-a resumed alone")[0]
            start = of(events(a.log_path), "start", world_size=1)
            assert start, "the job restarted with one node"
            step = resumed["step"]
            wait_until(lambda: any(e["step"] >= step + 3 for e in of(events(a.log_path), "step")
                                   if e["time"] > resumed["time"]), timeout=120,
                       interval=0.5, what="steps at world size 1")
            assert step - 1 == newest_committed_before(ckpt, step)
        finally:
            a.stop()
            if b is not None:
                b.stop()
    assert resumed["weights_sha256"] == reference_digest(ckpt, step - 1)
