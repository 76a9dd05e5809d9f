"""Issue 14, acceptance 1 and 2: the multi-host cluster converged and exercised on this machine.

ansible/inventories/loopback-cluster is deployed by the installed collection's
trainwatch.stack.site, as a real cluster is: five hosts, each its own loopback address
(127.0.0.x), its own prefix and its own dedicated supervisord: mon-01 and mon-02 (an HA pair:
Prometheus, Alertmanager cluster peers, a remediation replica each), db-01 (the replicas'
PostgreSQL store), gpu-01 and gpu-02 (node, simulated GPU, training and log exporters). Plain
processes per host, not containers: see docs/deploy.md ("The loopback cluster").

One cluster serves the module: converge, converge again (changed=0), the checks, then the
end-to-end run, which kills mon-01 (kill -9: its supervisord, Alertmanager, remediation
replica, Prometheus and node exporter) during a two-node torchrun job; the job's loss spike is
still cut exactly once, at the same step on both ranks, through mon-02. Then a disk alert for
gpu-01 cleans gpu-01 only. Everything the test started is stopped at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.cluster.cluster import Cluster, Host, bearer, get_json, new_cluster
from tests.support.net import free_port, wait_until
from tests.support.procs import ManagedProcess
from tests.training.support import EXAMPLE, JOB_BASE_ENV, events, of

pytestmark = pytest.mark.slow

JOB = "cluster-spike"
DAY = 86400
# Scrape jobs per inventory group (prometheus_scrape_groups' defaults).
JOBS_BY_GROUP = {"monitoring": {"prometheus", "alertmanager", "node"},
                 "remediation": {"remediation", "node"},
                 "gpu_nodes": {"node", "gpu", "training", "logscan"},
                 "postgresql": {"node"}}
PORT_OF_JOB = {"prometheus": "prometheus_port", "alertmanager": "alertmanager_port",
               "node": "node_exporter_port", "gpu": "gpu_exporter_port",
               "training": "training_exporter_port", "logscan": "log_scanner_port",
               "remediation": "remediation_port"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            real_binaries: dict[str, str]) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.skip("db-01's PostgreSQL runs as nobody: needs root here")
    workdir = tmp_path_factory.mktemp("cluster")
    built = new_cluster()
    try:
        first = built.converge(workdir)
        assert first.rc == 0 and first.total("failed") == 0, first.describe()
        built.converge(workdir)
        yield built
    finally:
        left = built.teardown()
        shutil.rmtree(built.root, ignore_errors=True)
        assert not left, f"processes left after supervisorctl shutdown: {left}"


def test_the_cluster_converges_and_a_second_run_changes_nothing(cluster: Cluster) -> None:
    first, second = cluster.runs
    assert set(first.recap) == set(cluster.hosts), first.describe()
    assert first.total("changed") > 0, first.describe()
    assert second.rc == 0 and second.total("failed") == 0, second.describe()
    assert second.total("changed") == 0, second.describe()
    for name in ("webhook.token", "control-api.token", "postgresql.password"):
        secret = cluster.secret(name)
        assert len(secret) >= 32 and all(secret not in run.output for run in cluster.runs), name
    # every host runs its own supervisord under its own prefix
    pids = {h.name: h.supervisord_pid() for h in cluster.hosts.values()}
    assert all(pids.values()) and len(set(pids.values())) == len(pids), pids


def expected_targets(cluster: Cluster) -> set[tuple[str, str, str]]:
    """(job, instance, node) of every scrape target the inventory implies."""
    out = set()
    for host in cluster.hosts.values():
        for group in host.groups:
            for job in JOBS_BY_GROUP.get(group, ()):
                out.add((job, f"{host.address}:{cluster.ports[PORT_OF_JOB[job]]}", host.name))
    return out


def test_every_target_is_up_in_both_prometheus_servers(cluster: Cluster) -> None:
    expected = expected_targets(cluster)
    for mon in cluster.group("monitoring"):
        url = f"{cluster.url(mon, 'prometheus_port')}/api/v1/targets"

        def all_up(url: str = url) -> list[dict] | None:
            targets = get_json(url)["data"]["activeTargets"]  # type: ignore[index]
            return targets if targets and all(t["health"] == "up" for t in targets) else None

        targets = wait_until(all_up, timeout=120, interval=1, what=f"every target up on {mon.name}")
        seen = {(t["labels"]["job"], t["labels"]["instance"], t["labels"]["node"])
                for t in targets}
        assert seen == expected, (mon.name, seen ^ expected)
        config = get_json(f"{cluster.url(mon, 'prometheus_port')}/api/v1/status/config")
        assert f"replica: {mon.name}" in config["data"]["yaml"]  # type: ignore[index]
    # node_exporter_collectors_only: the collectors the rules read, not node_exporter's defaults
    gpu = cluster.hosts["gpu-01"]
    node_metrics = requests.get(f"{cluster.url(gpu, 'node_exporter_port')}/metrics",
                                timeout=10).text
    assert "node_filesystem_avail_bytes{" in node_metrics
    assert "node_netstat_" not in node_metrics and "node_network_" not in node_metrics


def test_both_alertmanagers_are_cluster_peers(cluster: Cluster) -> None:
    mons = cluster.group("monitoring")
    gossip = {f"{m.address}:{cluster.ports['alertmanager_cluster_port']}" for m in mons}
    for mon in mons:
        url = f"{cluster.url(mon, 'alertmanager_port')}/api/v2/status"

        def peers(url: str = url) -> set[str] | None:
            cluster_status = get_json(url)["cluster"]  # type: ignore[index]
            found = {p["address"] for p in cluster_status["peers"]}
            return found if found == gossip and cluster_status["status"] == "ready" else None

        wait_until(peers, timeout=90, interval=1, what=f"{mon.name}'s Alertmanager peers")


def test_the_remediation_replicas_share_the_postgresql_store(cluster: Cluster) -> None:
    token = cluster.secret("webhook.token")
    db = cluster.group("postgresql")[0]
    for replica in cluster.group("remediation"):
        base = cluster.url(replica, "remediation_port")
        assert requests.get(f"{base}/readyz", timeout=5, verify=cluster.ca_file).ok
        config = (replica.prefix / "etc" / "remediation.yml").read_text()
        assert f"host: {db.address}" in config and "backend: postgresql" in config
        assert requests.get(f"{base}/v1/actions", headers=bearer(token), timeout=5,
                            verify=cluster.ca_file).ok


def test_the_services_with_a_credential_speak_only_verified_tls(cluster: Cluster) -> None:
    """The remediation webhook and API and every control API serve TLS with the deploy's CA;
    plain HTTP gets no answer, and a client that does not trust that CA refuses them. Their
    clients verify: Alertmanager's webhook and Prometheus's scrapes name the CA (the end-to-end
    run below goes through both), and the remediation service calls control APIs with it."""
    token = cluster.secret("webhook.token")
    services = [(h, "remediation_port", "/v1/actions") for h in cluster.group("remediation")]
    services += [(h, "training_exporter_port", "/v1/jobs") for h in cluster.group("gpu_nodes")]
    for host, port_var, path in services:
        url = cluster.url(host, port_var) + path
        assert url.startswith("https://")
        headers = bearer(token if port_var == "remediation_port"
                         else cluster.secret("control-api.token"))
        assert requests.get(url, headers=headers, timeout=5, verify=cluster.ca_file).ok, url
        with pytest.raises(requests.ConnectionError):
            requests.get(url.replace("https://", "http://"), headers=headers, timeout=5)
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(url, headers=headers, timeout=5)  # the system's CAs: not ours
    for mon in cluster.group("monitoring"):
        am = yaml.safe_load((mon.prefix / "etc" / "alertmanager" / "alertmanager.yml").read_text())
        hooks = [w for r in am["receivers"] if r["name"] == "remediation"
                 for w in r["webhook_configs"]]
        assert hooks and all(w["url"].startswith("https://")
                             and w["http_config"]["tls_config"]["ca_file"].endswith("ca.pem")
                             and not w["http_config"]["tls_config"].get("insecure_skip_verify")
                             for w in hooks), hooks
    for replica in cluster.group("remediation"):
        config = yaml.safe_load((replica.prefix / "etc" / "remediation.yml").read_text())
        assert config["tls_ca_file"].endswith("ca.pem") and config["tls_cert_file"]
        # The deployed CLI finds its replica over verified TLS from the file the deploy wrote
        # (an https:// URL and the CA), whatever CA the environment names.
        listed = subprocess.run(
            [str(replica.prefix / "venv" / "bin" / "trainwatch"), "actions", "--limit", "1"],
            capture_output=True, text=True, timeout=60, check=False,
            env={"PATH": "/usr/bin:/bin", "HOME": str(replica.prefix),
                 "REQUESTS_CA_BUNDLE": requests.certs.where(),
                 "TRAINWATCH_TOKEN_FILE": config["webhook_token_file"]})
        assert listed.returncode == 0, listed.stderr
        assert '"actions"' in listed.stdout


# --- end to end ------------------------------------------------------------------------------

@dataclass
class SpikeRun:
    agents: dict[str, ManagedProcess]  # GPU host name -> its torchrun agent
    killed: dict[str, list[int]]  # host -> pids killed with SIGKILL
    events: list[dict[str, Any]]


def node_env(cluster: Cluster, host: Host) -> dict[str, str]:
    """What a training job on this GPU node gets (the training_exporter role's contract)."""
    return {**JOB_BASE_ENV, "TRAINWATCH_JOB": JOB,
            "TRAINWATCH_EXPORTER_SOCKET": str(host.prefix / "run" / "training.sock"),
            "TRAINWATCH_LOG_DIR": str(host.prefix / "log" / "jobs")}


def agent_argv(host: Host, endpoint: str, *, is_host: bool) -> list[str]:
    """One torchrun agent per node, one rank each, meeting through the c10d rendezvous."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", JOB, "--rdzv-conf", f"is_host={int(is_host)}",
            "--local-addr", host.address, str(EXAMPLE),
            "--job", JOB, "--steps", "700", "--step-time", "0.1", "--spike-at-step", "300",
            "--print-every", "50"]


def run_spike(cluster: Cluster, workdir: Path) -> SpikeRun:
    """The two-node job; mon-01 is killed as soon as the spike is injected."""
    gpus = cluster.group("gpu_nodes")
    endpoint = f"{gpus[0].address}:{free_port()}"
    agents = {h.name: ManagedProcess(agent_argv(h, endpoint, is_host=i == 0),
                                     workdir / f"{h.name}-job.log", env=node_env(cluster, h))
              for i, h in enumerate(gpus)}
    try:
        def spiked() -> bool:
            return any(of(events(a), "spike_injected") for a in agents.values())

        wait_until(spiked, timeout=240, interval=0.1, what="the spike to be injected")
        victim = cluster.hosts["mon-01"]  # its Alertmanager, remediation replica, Prometheus
        killed = {victim.name: cluster.kill_host(victim)}
        for name, agent in agents.items():
            wait_until(lambda agent=agent: not agent.alive(), timeout=300,
                       what=f"the job on {name} to finish")
        found = [e for a in agents.values() for e in events(a)]
        return SpikeRun(agents=agents, killed=killed, events=found)
    finally:
        for agent in agents.values():
            agent.stop()


@pytest.fixture(scope="module")
def spike_run(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> SpikeRun:
    return run_spike(cluster, tmp_path_factory.mktemp("spike"))


def test_the_loss_spike_is_cut_once_at_the_same_step_on_both_nodes(
        cluster: Cluster, spike_run: SpikeRun) -> None:
    for name, agent in spike_run.agents.items():
        assert agent.proc.returncode == 0, (name, agent.log_text()[-3000:])
    assert spike_run.killed["mon-01"], "mon-01 was not killed"
    ranks = {e["rank"] for e in of(spike_run.events, "step")}
    assert ranks == {0, 1}, ranks
    applied = [e for e in of(spike_run.events, "command_applied", type="scale_lr")
               if e.get("status") == "applied"]
    by_rank = {r: [e for e in applied if e["rank"] == r] for r in (0, 1)}
    assert all(len(v) == 1 for v in by_rank.values()), f"not exactly one cut per rank: {applied}"
    steps = {v[0]["step"] for v in by_rank.values()}
    assert len(steps) == 1, f"ranks applied the cut at different steps: {applied}"
    spike_lr = of(spike_run.events, "spike_injected")[0]["lr"]
    assert all(v[0]["lr"] == pytest.approx(spike_lr * 0.5) for v in by_rank.values()), applied

    # The surviving replica (mon-02) shows one intent that acted; the store is shared, so it
    # holds whatever either replica accepted.
    survivor = cluster.hosts["mon-02"]
    body = get_json(f"{cluster.url(survivor, 'remediation_port')}/v1/actions",
                    params={"limit": 1000}, headers=bearer(cluster.secret("webhook.token")),
                    verify=cluster.ca_file)
    intents = [i for i in body["actions"]  # type: ignore[index]
               if i["alertname"] == "TrainingLossSpike" and i["labels"].get("training_job") == JOB
               and i["phase"] == "fire"]
    acted = [i for i in intents if i["decision"] == "act"]
    assert len(acted) == 1, intents
    assert acted[0]["state"] == "done", acted[0]


def plant(host: Host) -> tuple[Path, Path]:
    """An old and a new file in the node's training log dir (the cleanup's allowlisted root)."""
    logs = host.prefix / "log" / "jobs" / "old-job"
    logs.mkdir(parents=True, exist_ok=True)
    old, new = logs / "debug.log", logs / "recent.log"
    old.write_bytes(b"x" * 4096)
    past = time.time() - 30 * DAY
    os.utime(old, (past, past))
    new.write_bytes(b"y" * 4096)
    return old, new


def test_a_disk_alert_for_one_node_cleans_that_node_only(cluster: Cluster,
                                                          spike_run: SpikeRun) -> None:
    gpu1, gpu2 = cluster.hosts["gpu-01"], cluster.hosts["gpu-02"]
    old1, new1 = plant(gpu1)
    old2, new2 = plant(gpu2)
    survivor = cluster.hosts["mon-02"]  # mon-01 was killed by the spike run
    alert = {"labels": {"alertname": "NodeDiskFilling", "node": gpu1.name, "component": "node",
                        "severity": "warning", "mountpoint": "/", "instance": "disk-test"},
             "annotations": {"summary": "disk filling (posted by the test)"}}
    resp = requests.post(f"{cluster.url(survivor, 'alertmanager_port')}/api/v2/alerts",
                         json=[alert], timeout=5)
    assert resp.status_code == 200, resp.text

    def decided() -> list[dict] | None:
        body = get_json(f"{cluster.url(survivor, 'remediation_port')}/v1/actions",
                        params={"limit": 1000}, headers=bearer(cluster.secret("webhook.token")),
                        verify=cluster.ca_file)
        rows = [i for i in body["actions"]  # type: ignore[index]
                if i["alertname"] == "NodeDiskFilling" and i["phase"] == "fire"
                and i["state"] in ("done", "failed", "refused")]
        return rows or None

    rows = wait_until(decided, timeout=240, interval=1, what="the disk cleanup to finish")
    assert [(r["decision"], r["state"]) for r in rows] == [("act", "done")], rows
    assert not old1.exists() and new1.exists(), "gpu-01's old log was not cleaned"
    assert old2.exists() and new2.exists(), "gpu-02 was touched by gpu-01's alert"
