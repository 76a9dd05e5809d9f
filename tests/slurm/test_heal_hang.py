"""Issue 23, acceptance 2: a hang heals. A rank of a 2-node job under sbatch (srun starts
torchrun on each node, c10d rendezvous, gloo) is stopped with SIGSTOP. Real parts throughout:
one training exporter per node, Prometheus scraping them with the demo rule profile (it raises
TrainingStalled naming the stopped rank), Alertmanager delivering to the remediation service
(a real process), the stalled_job_diagnostics playbook (real Ansible running
trainwatch.exporters.node.tools.stack_dump and py-spy on every node of the job) and the shipped
stalled_job_quarantine playbook on the shared Slurm cluster (tests/slurm/conftest.py).

- one rank stopped: TrainingStalled names it, the diagnostics record names it, its node is
  drained (reason names the alert and the intent), the job is requeued once and resumes on the
  healthy nodes (the spare among them) from the newest committed checkpoint and steps on; the
  surviving node's exporter shows the new incarnation under the same job name, and the old
  incarnation's TrainingStalled resolves in Prometheus and Alertmanager;
- one rank stopped on each node: the evidence is spread over both, so the job is requeued and
  no node is drained.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.remediation.helpers import REPO, TOKEN, alert, stub_server
from tests.remediation.processes import RunningService, service_config, start_service
from tests.remediation.test_faults import HANGS
from tests.slurm.cluster import SlurmCluster
from tests.slurm.fixtures import HOSTS, calls, drains, job_nodes, requeues, service_overrides
from tests.slurm.test_heal_e2e import events, newest_committed_before
from tests.slurm.test_quarantine import NODE_HOST, deliver, running_on, services
from tests.support.alertmanager_config import render_one
from tests.support.net import free_port, wait_until
from tests.support.postgres import PgCluster
from tests.support.procs import alertmanager, prometheus
from tests.training.support import Exporter, exporter, of, write_token
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.node.tools.stack_dump import rank_processes
from trainwatch.remediation.store import NewIntent

PLAYBOOKS = REPO / "remediation" / "playbooks"
RULES = REPO / "alert_rules" / "generated" / "demo" / "training.yml"
GPU_RULES = REPO / "alert_rules" / "generated" / "demo" / "gpu.yml"


def _production_global() -> dict[str, str]:
    """The Prometheus role's scrape and evaluation settings (its defaults file)."""
    prom = yaml.safe_load((REPO / "ansible/roles/prometheus/defaults/main.yml").read_text())
    return {key: str(prom[f"prometheus_{key}"])
            for key in ("scrape_interval", "evaluation_interval", "scrape_timeout")}


# monitoring()'s profiles: Prometheus's global settings, the generated rules, the
# Alertmanager variables over the alertmanager role's defaults
PROFILES: dict[str, dict[str, Any]] = {
    "demo": {"global": lambda: {"scrape_interval": "1s", "evaluation_interval": "1s"},
             "rules": RULES.parent,
             "alertmanager": {"alertmanager_group_wait": "1s",
                              "alertmanager_group_interval": "1s",
                              "alertmanager_repeat_interval": "1h"}},
    "production": {"global": _production_global,
                   "rules": REPO / "alert_rules" / "generated" / "production",
                   "alertmanager": {}},
}


@dataclass
class Stack:
    """The monitoring and remediation side of one test: an exporter per node, Prometheus,
    Alertmanager, the service, and the log of every Slurm command the service ran.
    `replicas`: every remediation replica, `service` first (one unless monitoring() was asked
    for more: then they share one PostgreSQL store and Alertmanager sends to each)."""

    exporters: dict[str, Exporter]  # scheduler node -> its training exporter
    prom: str
    am: str
    service: RunningService
    log: Path
    token_file: Path
    replicas: list[RunningService] = field(default_factory=list)


@contextmanager
def monitoring(tmp_path: Path, cluster: SlurmCluster, books: tuple[str, ...] = (
        "stalled_job_diagnostics", "stalled_job_quarantine"),
        gpus: dict[str, str] | None = None, *, profile: str = "demo",
        fast_alerts: bool = False, alertmanager_port: int | None = None,
        replicas: int = 1, **rails: Any) -> Iterator[Stack]:
    """The stack around `cluster` with the shipped playbooks `books`; `gpus` (scheduler node
    -> GPU exporter URL) adds those exporters' scrape job and the GPU rules; `rails` are the
    scheduler settings over min_healthy_fraction 0.5.

    `profile` "production" (benchmarks/recovery.py): the Prometheus role's scrape and
    evaluation intervals, the rules of alert_rules/generated/production and Alertmanager with
    the alertmanager role's grouping (group_wait, group_interval) instead of the demo's 1 s.
    `fast_alerts`: the training exporters post a killed rank to this Alertmanager
    (`--alertmanager-url`); `alertmanager_port` fixes its port, so that exporters started
    before this stack (the GPU exporters) can be pointed at it too.

    `replicas` above 1 (benchmarks/chaos.py's failover): that many remediation services, each
    with its own config, folder, port and marker, sharing one PostgreSQL store (a throwaway
    server, tests/support/postgres.py), with Alertmanager sending every alert to each: the
    deployed HA setup (ansible/inventories/loopback-cluster: two replicas on PostgreSQL).
    The first is in `tmp_path / "service"`, as the one replica is."""
    if profile not in PROFILES:
        raise ValueError(f"profile {profile!r}: one of {sorted(PROFILES)}")
    if replicas < 1:
        raise ValueError(f"replicas {replicas}: at least 1")
    with ExitStack() as stack:
        token = write_token(tmp_path, "control.token")
        early_am_port = alertmanager_port or (free_port() if fast_alerts else None)
        fast = (("--alertmanager-url", f"http://127.0.0.1:{early_am_port}")
                if fast_alerts else ())
        exporters = {node: stack.enter_context(exporter(tmp_path, f"exp-{host}", node=host,
                                                        token=token, extra=fast))
                     for host, node in HOSTS.items()}
        pager, _ = stack.enter_context(stub_server())
        overrides, log = service_overrides(tmp_path, cluster, pager,
                                           **{"min_healthy_fraction": 0.5, **rails})
        inventory = Path(overrides["ansible_inventory"])
        hosts = yaml.safe_load(inventory.read_text())
        for host_vars in hosts["all"]["hosts"].values():
            host_vars["trainwatch_python"] = sys.executable  # stack_dump with py-spy beside it
        inventory.write_text(yaml.safe_dump(hosts))
        docs = [yaml.safe_load((PLAYBOOKS / f"{name}.yaml").read_text()) for name in books]
        prom_port, am_port = free_port(), early_am_port or free_port()
        if replicas > 1:  # the replicas' shared store, as deployed: PostgreSQL
            pg = PgCluster()
            stack.callback(pg.stop)
            overrides["store"] = pg.database(tmp_path / "pg")
        services = []
        for index in range(replicas):
            port = free_port()
            folder = tmp_path / ("service" if index == 0 else f"service-{index + 1}")
            services.append(stack.enter_context(start_service(service_config(
                folder, docs, port=port, **overrides,
                prometheus_url=f"http://127.0.0.1:{prom_port}",
                alertmanager_url=f"http://127.0.0.1:{am_port}"), port)))
        service = services[0]
        webhook_token = tmp_path / "webhook.token"
        webhook_token.write_text(TOKEN)
        am_config = render_one({
            "alertmanager_remediation_urls": [f"{s.url}/v1/alerts" for s in services],
            "alertmanager_remediation_token_file": str(webhook_token),
            **PROFILES[profile]["alertmanager"]}, tmp_path / "am-render")
        am = stack.enter_context(alertmanager(tmp_path, am_config, port=am_port))
        prom_config = tmp_path / "prometheus.yml"
        prom_config.write_text(json.dumps({
            "global": PROFILES[profile]["global"](),
            "rule_files": [str(PROFILES[profile]["rules"] / "training.yml"),
                           str(PROFILES[profile]["rules"] / "goodput.yml"),
                           *([str(PROFILES[profile]["rules"] / "gpu.yml")] if gpus else [])],
            "alerting": {"alertmanagers": [{"static_configs": [
                {"targets": [am.removeprefix("http://")]}]}]},
            # instance host:port with the inventory host, as on a real cluster (the
            # diagnostics find the job's nodes by it)
            "scrape_configs": [{"job_name": "training", "static_configs": [
                {"targets": [exp.url.removeprefix("http://")],
                 "labels": {"instance": f"{NODE_HOST[node]}:{exp.url.rsplit(':', 1)[1]}"}}
                for node, exp in exporters.items()]}, *([{"job_name": "gpu", "static_configs": [
                    {"targets": [url.removeprefix("http://")],
                     "labels": {"instance": f"{NODE_HOST[node]}:{url.rsplit(':', 1)[1]}"}}
                    for node, url in gpus.items()]}] if gpus else [])],
        }))
        prom = stack.enter_context(prometheus(tmp_path, prom_config, port=prom_port))
        yield Stack(exporters, prom, am, service, log, token[1], services)


def submit_job(cluster: SlurmCluster, stack: Stack, tmp_path: Path, job: str,
               ranks_per_node: int) -> tuple[str, Path, Path]:
    """The training job under sbatch, each node's ranks reporting to that node's exporter;
    (Slurm job id, its output file, its checkpoint dir)."""
    out, ckpt = tmp_path / "job.out", tmp_path / "ckpt"
    cases = "\n".join(
        f"  {node}) export TRAINWATCH_EXPORTER_SOCKET={exp.socket} ;;"
        for node, exp in stack.exporters.items())
    launcher = tmp_path / "launch.sh"
    launcher.write_text("\n".join([
        "#!/bin/bash",
        "# one torchrun agent per node; the ranks report to this node's exporter",
        f'case "$SLURMD_NODENAME" in\n{cases}\n  *) exit 2 ;;\nesac',
        f"exec {sys.executable} -m torch.distributed.run --nnodes=2 "
        f"--nproc-per-node={ranks_per_node} --rdzv-backend=c10d "
        f"--rdzv-endpoint=127.0.0.1:{free_port()} "
        "--rdzv-id=hang-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0} "
        f"{REPO / 'examples' / 'train_ddp.py'} --job {job} --steps 100000 --step-time 0.1 "
        f"--print-every 1 --checkpoint-dir {ckpt} --checkpoint-every 5 "
        "--keep-checkpoints 1000 --sync-checkpoints", ""]))
    script = tmp_path / "job.sh"
    script.write_text("\n".join([
        "#!/bin/bash",
        "#SBATCH --nodes=2 --requeue --open-mode=append",
        f"#SBATCH --output={out}",
        "export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 TORCH_FR_BUFFER_SIZE=200",
        f"export TRAINWATCH_JOB={job}",
        f"export {catalog.ENV_DIAGNOSTICS_DIR}={tmp_path / 'diagnostics'}",
        "echo '{\"event\": \"incarnation\", \"restart_count\": '${SLURM_RESTART_COUNT:-0}', "
        "\"time\": '$(date +%s.%N)', \"nodes\": \"'$SLURM_JOB_NODELIST'\"}'",
        f"exec srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 /bin/bash {launcher}",
        ""]))
    submitted = cluster.run(["sbatch", "--parsable", f"--chdir={tmp_path}", str(script)])
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0], out, ckpt


def firing(prom: str, alertname: str, job: str) -> list[dict[str, Any]]:
    alerts = requests.get(f"{prom}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == alertname
            and a["labels"].get("training_job") == job and a["state"] == "firing"]


def active_in_alertmanager(am: str, alertname: str, job: str) -> list[dict[str, Any]]:
    resp = requests.get(f"{am}/api/v2/alerts", timeout=5, params={
        "filter": [f'alertname="{alertname}"', f'training_job="{job}"'], "active": "true"})
    resp.raise_for_status()
    return resp.json()


def audit(stack: Stack, playbook: str, decision: str) -> list[dict[str, Any]]:
    return [a for a in stack.service.actions()["audit"]
            if a["playbook"] == playbook and a["decision"] == decision]


def stop_rank(job: str, node: str, which: int = 0) -> dict[str, Any]:
    """SIGSTOP one rank process of `job` that Slurm started for `node` (found the way the
    diagnostics find it)."""
    procs = wait_until(lambda: rank_processes(job, node), timeout=60,
                       what=f"a rank process of {job} on {node}")
    proc = sorted(procs, key=lambda p: int(p["rank"]))[which]
    os.kill(proc["pid"], signal.SIGSTOP)
    return proc


def wait_checkpoints(out: Path, count: int = 2) -> None:
    wait_until(lambda: len({e["step"] for e in of(events(out), "checkpoint_saved")}) >= count,
               timeout=240, interval=0.5, what=f"{count} committed checkpoints")


def test_stopped_rank_node_drained_job_requeued_and_resumed(slurm: SlurmCluster,
                                                            tmp_path: Path) -> None:
    job_name = "heal-hang"
    with monitoring(tmp_path, slurm) as stack:
        job, out, ckpt = submit_job(slurm, stack, tmp_path, job_name, ranks_per_node=1)
        first = running_on(slurm, job)
        assert len(first) == 2
        wait_checkpoints(out)
        good, bad = first
        stopped = stop_rank(job_name, bad)
        t_stop = time.time()
        host = NODE_HOST[bad]
        # the alert names the stopped rank and its node
        alerts = wait_until(lambda: firing(stack.prom, "TrainingStalled", job_name),
                            timeout=120, what="TrainingStalled firing")
        assert [(a["labels"]["rank"], a["labels"]["node"]) for a in alerts] == [
            (stopped["rank"], host)], alerts
        t_alert = time.time()
        acted = wait_until(lambda: audit(stack, "stalled_job_quarantine", "acted"),
                           timeout=240, what="the stall's quarantine acted")
        t_acted = time.time()
        [diagnosed] = audit(stack, "stalled_job_diagnostics", "acted")
        # the diagnostics record names it: its node's record has the process, stopped
        by_host = diagnosed["detail"]["results"][0]["result"]["captured_by_host"]
        record = json.loads(next(iter(by_host[host].values())))
        assert record["collectives"]["stopped"] == [stopped["rank"]], record["collectives"]
        assert [p["rank"] for p in record["processes"]] == [stopped["rank"]]
        # the quarantine's audit holds the evidence: the alert, the suspects, the record's id
        plan = acted[0]["detail"]["results"][0]["result"]["plan"]
        assert plan["alert"]["rank"] == stopped["rank"]
        assert plan["evidence"]["diagnostics_intent"] == diagnosed["intent_id"]
        assert plan["evidence"]["record"]["suspect_ranks"] == [stopped["rank"]]
        assert (plan["fault"]["action"], plan["fault"]["nodes"]) == ("quarantine", [bad])
        assert len(drains(stack.log)) == 1 and len(requeues(stack.log)) == 1
        assert slurm.node_reason(bad) == (
            f"trainwatch: TrainingStalled intent {acted[0]['intent_id']}: quarantine (hang), "
            "job requeued, resume after node_health_check")
        # the new incarnation: on the healthy nodes (the spare among them), resumed from the
        # newest committed checkpoint, stepping on
        second = running_on(slurm, job, timeout=120)
        assert bad not in second and good in second and len(second) == 2
        resumed = wait_until(lambda: (lambda r: r if len(r) == 2 else None)(
            of(events(out), "resumed")), timeout=180, interval=0.5, what="both ranks resumed")
        step = resumed[0]["step"]
        assert {r["step"] for r in resumed} == {step}
        wait_until(lambda: any(e["step"] >= step + 3 for e in of(events(out), "step")
                               if e["time"] > resumed[0]["time"]), timeout=120, interval=0.5,
                   what="steps after the resume")
        assert step - 1 == newest_committed_before(ckpt, step)
        assert of(events(out), "incarnation", restart_count=1)
        first_step = min(e["time"] for e in of(events(out), "step")
                         if e["time"] > resumed[0]["time"])
        print(f"SIGSTOP -> TrainingStalled firing (demo profile) {t_alert - t_stop:.1f} s, "
              f"-> diagnosed, drained and requeued {t_acted - t_alert:.1f} s, -> first step "
              f"after the resume {first_step - t_acted:.1f} s; total {first_step - t_stop:.1f} s")
        # the surviving node's exporter: the same job name, the new incarnation (restarts 1)
        wait_until(lambda: set(stack.exporters[good].samples(
            catalog.TRAINING_RESTARTS, job_name).values()) == {1.0}, timeout=60,
            what="the new incarnation on the surviving node's exporter")
        # the old incarnation's stall resolves, in Prometheus and in Alertmanager
        wait_until(lambda: not firing(stack.prom, "TrainingStalled", job_name), timeout=120,
                   what="TrainingStalled resolved in Prometheus")
        wait_until(lambda: not active_in_alertmanager(stack.am, "TrainingStalled", job_name),
                   timeout=120, what="TrainingStalled resolved in Alertmanager")
        assert len(drains(stack.log)) == 1 and len(requeues(stack.log)) == 1
        slurm.run(["scancel", job])
        wait_until(lambda: job_nodes(slurm, job)[0] == "", timeout=60, what="job gone")


def test_the_next_incarnations_hang_is_healed_inside_the_first_ones_cooldown(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """docs/performance.md, Chaos soak, bug 3: after one hang was healed, a hang of the job's
    next incarnation minutes later (inside both stall playbooks' cooldowns on the job) is
    diagnosed, drained and requeued too; each stall is acted on once. The rails let the
    second drain through (min_healthy_fraction 0.3: one of three nodes left in service)."""
    job_name = "heal-hang-twice"
    with monitoring(tmp_path, slurm, min_healthy_fraction=0.3) as stack:
        job, out, _ = submit_job(slurm, stack, tmp_path, job_name, ranks_per_node=1)
        good, bad = running_on(slurm, job)
        wait_checkpoints(out)
        stop_rank(job_name, bad)
        wait_until(lambda: audit(stack, "stalled_job_quarantine", "acted"), timeout=240,
                   what="the first stall's quarantine acted")
        # the next incarnation, on the surviving node and the spare, resumes and steps
        second = running_on(slurm, job, timeout=120)
        assert bad not in second and good in second and len(second) == 2
        [spare] = [node for node in second if node != good]
        resumed = wait_until(lambda: (lambda r: r if len(r) == 2 else None)(
            of(events(out), "resumed")), timeout=180, interval=0.5, what="both ranks resumed")
        wait_until(lambda: len({e["step"] for e in of(events(out), "checkpoint_saved")
                                if e["time"] > resumed[0]["time"]}) >= 2, timeout=240,
                   interval=0.5, what="2 checkpoints of the next incarnation")
        stop_rank(job_name, spare)
        acted = wait_until(lambda: (lambda a: a if len(a) == 2 else None)(
            audit(stack, "stalled_job_quarantine", "acted")), timeout=300,
            what="the second stall's quarantine acted")
        plans = sorted((a["intent_id"], a["detail"]["results"][0]["result"]["plan"])
                       for a in acted)
        assert [plan["fault"]["nodes"] for _, plan in plans] == [[bad], [spare]]
        assert len(audit(stack, "stalled_job_diagnostics", "acted")) == 2
        assert [[a for a in c if a.startswith("NodeName=")] for c in drains(stack.log)] == [
            [f"NodeName={bad}"], [f"NodeName={spare}"]]
        assert len(requeues(stack.log)) == 2, "each stall requeued the job once"
        slurm.run(["scancel", job])
        wait_until(lambda: job_nodes(slurm, job)[0] == "", timeout=60, what="job gone")


def test_stopped_ranks_on_both_nodes_requeue_without_draining(slurm: SlurmCluster,
                                                              tmp_path: Path) -> None:
    job_name = "heal-hang-both"
    with monitoring(tmp_path, slurm) as stack:
        job, out, _ = submit_job(slurm, stack, tmp_path, job_name, ranks_per_node=2)
        first = running_on(slurm, job)
        wait_checkpoints(out)
        stopped = {stop_rank(job_name, node, which=1)["rank"] for node in first}
        # the rule's suspects are on both nodes (which ranks it names with half the ranks
        # stopped is the rule's business: in one of the first two runs here it named the
        # two waiting ranks, one on each node); the diagnostics record names the stopped
        hosts = {NODE_HOST[n] for n in first}
        wait_until(lambda: {a["labels"]["node"] for a in firing(
            stack.prom, "TrainingStalled", job_name)} == hosts, timeout=120,
            what="TrainingStalled firing for a rank on each node")
        acted = wait_until(lambda: audit(stack, "stalled_job_quarantine", "acted"),
                           timeout=240, what="the stall's quarantine acted")
        plan = acted[0]["detail"]["results"][0]["result"]["plan"]
        assert plan["fault"]["action"] == "restart", plan
        assert sorted(plan["fault"]["nodes"]) == sorted(first)
        assert sorted(plan["evidence"]["record"]["suspect_ranks"]) == sorted(stopped)
        assert "none is drained" in plan["fault"]["reason"]
        # the other alert's quarantine: one restart per stall (the job's cooldown)
        wait_until(lambda: audit(stack, "stalled_job_quarantine", "cooled_down"), timeout=240,
                   what="the second alert's quarantine cooled down")
        assert drains(stack.log) == [] and len(requeues(stack.log)) == 1
        assert all("drain" not in slurm.node_state(n) for n in slurm.nodes)
        running_on(slurm, job, timeout=120)
        wait_until(lambda: of(events(out), "incarnation", restart_count=1), timeout=60,
                   what="the job restarted")
        slurm.run(["scancel", job])
        wait_until(lambda: job_nodes(slurm, job)[0] == "", timeout=60, what="job gone")


@pytest.mark.parametrize("rail", ["observe_only", "min_healthy_fraction"])
def test_a_stall_quarantine_goes_through_the_rails(slurm: SlurmCluster, tmp_path: Path,
                                                   rail: str) -> None:
    """The stall's quarantine is decided on its diagnostics record (the stopped rank is on
    node-b, the alert names node-a: the record wins) and through the same rails as a lost
    GPU's: observe-only changes nothing in Slurm and says what it would have done; below the
    minimum healthy fraction the intent waits for approval and the on-call is paged."""
    book = yaml.safe_load((PLAYBOOKS / "stalled_job_quarantine.yaml").read_text())
    rails: dict[str, Any] = {"min_healthy_fraction": 0.5}
    if rail == "observe_only":
        book["observe_only"] = True
    else:
        rails["min_healthy_fraction"] = 0.9  # 2 of 3 in service after a drain: below it
    with services(tmp_path, slurm, [book], **rails) as (svcs, log, pager):
        svc = svcs[0]
        with svc.store.transaction() as tx:  # the job's diagnostics, as the playbook left them
            diag = tx.insert_intent(NewIntent(
                fingerprint="diag", starts_at="2026-11-21T18:03:15.119Z",
                playbook="stalled_job_diagnostics", phase="fire", alertname="TrainingStalled",
                labels={"training_job": "j"}, annotations={}, target_key="training_job=j",
                state="done", decision="act"))
            assert diag is not None
            tx.update_intent(diag, results=[{"step": 0, "action": "ansible", "result": {
                "captured_by_host": HANGS["stopped"]}}])
        deliver(svc, alert("TrainingStalled", {"training_job": "j", "rank": "0",
                                               "node": "node-a"}))
        svc.wait_idle(60)
        expected = "observe_only" if rail == "observe_only" else "awaiting_approval"
        [record] = svc.audit(expected)
        plan = record["detail"]["plan"]
        assert plan["fault"]["nodes"] == ["tw-gpu-02"]
        assert plan["evidence"]["diagnostics_intent"] == diag
        assert plan["evidence"]["record"]["suspect_ranks"] == ["1"]
        pages = wait_until(lambda: pager.posts("/page"), timeout=30, what="the page")
        assert [p.body["event"] for p in pages] == [f"quarantine_{expected}"]
        assert not [c for c in calls(log) if c[0] == "scontrol"]
    assert all("drain" not in slurm.node_state(n) for n in slurm.nodes)
