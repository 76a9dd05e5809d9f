"""What a person checks by hand after converging the stack (molecule verify, testinfra).

The prefix and ports are the ones the converge used: read from the vars file named by
TRAINWATCH_MOLECULE_VARS (tests/field_checks/test_molecule.py writes it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

VARS = yaml.safe_load(Path(os.environ["TRAINWATCH_MOLECULE_VARS"]).read_text())
PREFIX = Path(VARS["trainwatch_prefix"])
PROGRAMS = ("prometheus", "alertmanager", "node_exporter", "victoriametrics", "gpu_exporter",
            "training_exporter", "log_scanner", "remediation")
# The endpoint of each service that answers only once it is ready.
READY = {
    "prometheus_port": "/-/ready",
    "alertmanager_port": "/-/ready",
    "victoriametrics_port": "/health",
    "node_exporter_port": "/metrics",
    "gpu_exporter_port": "/metrics",
    "training_exporter_port": "/metrics",
    "log_scanner_port": "/metrics",
    "remediation_port": "/healthz",
}


def url(port_var: str, path: str) -> str:
    return f"http://127.0.0.1:{VARS[port_var]}{path}"


def get(host, address: str) -> str:
    """The body of a GET from the host itself (curl-like, with the host's own Python)."""
    cmd = host.run("python3 -c 'import sys, urllib.request; "
                   "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10)"
                   ".read().decode())' %s", address)
    assert cmd.rc == 0, f"{address}: {cmd.stderr}"
    return cmd.stdout


def test_every_program_runs_under_the_dedicated_supervisord(host) -> None:
    status = host.run("supervisorctl -c %s status", str(PREFIX / "etc" / "supervisord.conf"))
    running = {line.split()[0] for line in status.stdout.splitlines() if "RUNNING" in line}
    assert set(PROGRAMS) <= running, status.stdout


@pytest.mark.parametrize("port_var", sorted(READY))
def test_every_service_listens_on_loopback_only_and_answers(host, port_var: str) -> None:
    assert host.socket(f"tcp://127.0.0.1:{VARS[port_var]}").is_listening
    assert not host.socket(f"tcp://0.0.0.0:{VARS[port_var]}").is_listening
    get(host, url(port_var, READY[port_var]))


def test_the_gpu_exporter_says_its_gpus_are_simulated(host) -> None:
    assert "trainwatch_gpu_exporter_simulated 1" in get(host, url("gpu_exporter_port", "/metrics"))


@pytest.mark.parametrize("path", ["control.token", "remediation-webhook.token",
                                  "alertmanager/alertmanager.yml", "remediation.yml"])
def test_secrets_are_readable_by_the_service_group_only(host, path: str) -> None:
    secret = host.file(str(PREFIX / "etc" / path))
    assert secret.is_file
    assert secret.mode == 0o640


def test_the_configs_pass_their_own_validators(host) -> None:
    prometheus = PREFIX / "etc" / "prometheus" / "prometheus.yml"
    alertmanager = PREFIX / "etc" / "alertmanager" / "alertmanager.yml"
    assert host.run("promtool check config %s", str(prometheus)).rc == 0
    assert host.run("amtool check-config %s", str(alertmanager)).rc == 0


def test_prometheus_writes_to_victoriametrics(host) -> None:
    config = yaml.safe_load(host.file(str(PREFIX / "etc" / "prometheus" / "prometheus.yml"))
                            .content_string)
    urls = [target["url"] for target in config.get("remote_write", [])]
    assert url("victoriametrics_port", "/api/v1/write") in urls


def test_prometheus_scrapes_every_exporter(host) -> None:
    targets = json.loads(get(host, url("prometheus_port", "/api/v1/targets")))
    jobs = {t["labels"]["job"] for t in targets["data"]["activeTargets"]}
    assert {"node", "gpu", "training", "logscan", "remediation"} <= jobs
