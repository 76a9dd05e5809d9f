"""A node comes back only through `trainwatch-resume-node` after its health check passes
(issue 23): never one drained by someone else, never with a GPU lost or XIDs since the drain,
never from a pattern. Real Slurm, real Ansible (node_health_check.yml runs
the node health check against the fake NVML), real Prometheus for the XID count."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.remediation.helpers import StubState, stub_server, write_config
from tests.slurm.cluster import SlurmCluster
from tests.slurm.fixtures import HOSTS, calls, recording_bin, scontrol_calls, write_inventory
from tests.support.net import wait_until
from tests.support.procs import prometheus
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.node.gpu.fake_nvml import simulated_scenario
from trainwatch.remediation.config import SchedulerSettings, load_config
from trainwatch.remediation.resume import main as resume_main
from trainwatch.remediation.schedulers.slurm import SlurmScheduler
from trainwatch.remediation.stores import open_store


def _scenario(path: Path, *, lost: bool = False, pending_remap: bool = False) -> None:
    scenario = simulated_scenario(2, dynamic=False)
    scenario["gpus"][0]["lost"] = lost
    if pending_remap:
        scenario["gpus"][1]["remapped_rows"] = [0, 1, 1, 0]
    path.write_text(json.dumps(scenario))


@dataclass
class Rig:
    config: Path  # the service's config file
    nvml: dict[str, Path]  # host -> its fake NVML scenario
    exporter: StubState  # serves the GPU exporter's /metrics text Prometheus scrapes
    log: Path  # every Slurm command the service ran
    prom_url: str


@pytest.fixture
def rig(slurm: SlurmCluster, tmp_path: Path) -> Iterator[Rig]:
    nvml = {host: tmp_path / f"nvml-{host}.json" for host in HOSTS}
    for path in nvml.values():
        _scenario(path)
    inventory = write_inventory(tmp_path / "hosts.yml", {
        host: {"trainwatch_python": sys.executable, "trainwatch_fake_nvml": str(nvml[host]),
               "trainwatch_health_burn_seconds": 0, "trainwatch_expect_gpus": 2}
        for host in HOSTS})
    bin_dir, log = recording_bin(tmp_path / "bin")
    with stub_server() as (exporter, state):
        prom_config = tmp_path / "prometheus.yml"
        prom_config.write_text(json.dumps({
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "gpu", "static_configs": [
                {"targets": [exporter], "labels": {"node": "node-a"}}]}]}))
        with prometheus(tmp_path, prom_config) as prom_url:
            config = write_config(tmp_path / "svc", ansible_inventory=str(inventory),
                                  prometheus_url=prom_url, scheduler={
                                      "kind": "slurm", "bin_dir": str(bin_dir),
                                      "slurm_conf": str(slurm.conf)})
            yield Rig(config, nvml, state, log, prom_url)


def _drain(cluster: SlurmCluster, node: str) -> None:
    """Drained as the quarantine action drains (a Trainwatch reason)."""
    SlurmScheduler(SchedulerSettings(slurm_conf=cluster.conf)).drain(
        node, "GpuLost intent 1: quarantine")


def _audit(config: Path) -> list[dict[str, Any]]:
    store = open_store(load_config(config))
    try:
        return store.list_audit(100)
    finally:
        store.close()


def test_resume_only_after_health_check(slurm: SlurmCluster, rig: Rig,
        capsys: pytest.CaptureFixture[str]) -> None:
    config, nvml, log = rig.config, rig.nvml, rig.log
    _drain(slurm, "tw-gpu-01")
    # a GPU still lost: the node stays drained
    _scenario(nvml["node-a"], lost=True)
    assert resume_main(["--config", str(config), "node-a"]) == 1
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "GPU 0" in out["reason"] and "drain" in slurm.node_state("tw-gpu-01")
    # rows pending remapping: still drained
    _scenario(nvml["node-a"], pending_remap=True)
    assert resume_main(["--config", str(config), "node-a"]) == 1
    assert "pending remapping" in json.loads(capsys.readouterr().out.splitlines()[-1])["reason"]
    assert not [c for c in scontrol_calls(log) if "State=RESUME" in c]
    # healthy: resumed, audited
    _scenario(nvml["node-a"])
    assert resume_main(["--config", str(config), "node-a"]) == 0
    capsys.readouterr()
    wait_until(lambda: slurm.node_state("tw-gpu-01") == "idle", timeout=30, what="idle")
    decisions = [a["decision"] for a in _audit(config)]
    assert decisions.count("node_resume_refused") == 2 and decisions.count("node_resumed") == 1


def test_xids_since_the_drain_keep_it_drained(slurm: SlurmCluster, rig: Rig,
        capsys: pytest.CaptureFixture[str]) -> None:
    config, exporter, prom_url = rig.config, rig.exporter, rig.prom_url
    _drain(slurm, "tw-gpu-01")
    exporter.metrics_text = (f'{catalog.GPU_XID_ERRORS}{{gpu="0",uuid="GPU-x",name="H100",'
                             'xid="79"} 1\n')
    wait_until(lambda: requests.get(f"{prom_url}/api/v1/query", params={
        "query": catalog.GPU_XID_ERRORS}, timeout=5).json()["data"]["result"], timeout=30,
        what="the XID scraped")
    assert resume_main(["--config", str(config), "node-a"]) == 1
    reason = json.loads(capsys.readouterr().out.splitlines()[-1])["reason"]
    assert "XIDs since the drain" in reason and "'79'" in reason
    assert "drain" in slurm.node_state("tw-gpu-01")


@pytest.mark.parametrize("host", ["node-*", "tw-gpu-0[1-3]", "all", "node-d"])
def test_a_pattern_is_refused_before_any_command(slurm: SlurmCluster, rig: Rig,
                                                 host: str) -> None:
    config, log = rig.config, rig.log
    assert resume_main(["--config", str(config), host]) == 1
    assert calls(log) == []


def test_a_node_drained_by_someone_else_is_theirs(slurm: SlurmCluster, rig: Rig,
        capsys: pytest.CaptureFixture[str]) -> None:
    config, log = rig.config, rig.log
    slurm.run(["scontrol", "update", "NodeName=tw-gpu-02", "State=DRAIN", "Reason=bad fan"])
    assert resume_main(["--config", str(config), "node-b"]) == 1
    assert "someone else" in json.loads(capsys.readouterr().out.splitlines()[-1])["reason"]
    assert slurm.node_reason("tw-gpu-02") == "bad fan"
    assert scontrol_calls(log) == []
