"""What a person checks by hand after converging the stack (molecule verify, testinfra).

The prefix and ports are the ones the converge used: read from the vars file named by
TRAINWATCH_MOLECULE_VARS (tests/field_checks/test_molecule.py writes it).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
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


def poll(check: Callable[[], bool], what: str, timeout: float = 120) -> None:
    """Until `check()` holds; services that just started need a few scrapes and evaluations."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.5)


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


@pytest.mark.parametrize("path", ["alertmanager/alertmanager.yml", "remediation.yml"])
def test_configs_with_secrets_are_readable_by_the_service_group_only(host, path: str) -> None:
    secret = host.file(str(PREFIX / "etc" / path))
    assert secret.is_file
    assert secret.mode == 0o640


@pytest.mark.parametrize("path", ["control.token", "remediation-webhook.token"])
def test_tokens_are_readable_by_the_services_user_only(host, path: str) -> None:
    """The group is the training users' way to the exporter's sockets; a rank needs no token
    (the exporter knows it by its kernel identity), so no token is the group's to read."""
    secret = host.file(str(PREFIX / "etc" / path))
    assert secret.is_file
    assert secret.mode == 0o600


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


def test_prometheus_scrapes_every_exporter_and_every_target_is_up(host) -> None:
    def targets() -> list[dict]:
        return json.loads(get(host, url("prometheus_port", "/api/v1/targets")))[
            "data"]["activeTargets"]

    poll(lambda: bool(targets()) and all(t["health"] == "up" for t in targets()),
         "every Prometheus target up")
    jobs = {t["labels"]["job"] for t in targets()}
    assert jobs == {"prometheus", "alertmanager", "node", "gpu", "training", "logscan",
                    "remediation"}


def test_every_installed_alert_rule_is_loaded(host) -> None:
    rules_dir = PREFIX / "etc" / "prometheus" / "rules"
    installed = set()
    for path in host.file(str(rules_dir)).listdir():
        if path.endswith((".yml", ".yaml")):
            content = yaml.safe_load(host.file(str(rules_dir / path)).content_string)
            installed |= {rule["alert"] for group in content["groups"]
                          for rule in group["rules"] if "alert" in rule}
    groups = json.loads(get(host, url("prometheus_port", "/api/v1/rules")))["data"]["groups"]
    loaded = {rule["name"] for group in groups for rule in group["rules"]
              if rule["type"] == "alerting"}
    assert "Watchdog" in installed
    assert installed <= loaded


def test_the_watchdog_alert_reaches_alertmanager(host) -> None:
    def watchdog() -> bool:
        alerts = json.loads(get(host, url("alertmanager_port", "/api/v2/alerts")))
        return any(a["labels"].get("alertname") == "Watchdog" for a in alerts)

    poll(watchdog, "the Watchdog alert in Alertmanager")


def test_the_stacks_own_start_fired_nothing(host) -> None:
    """A fresh deploy is silent: since Prometheus first started (two converges ago), none of
    the stack's own alerts (TargetDown, AlertmanagerNotificationsFailing, ...) was ever pending,
    and the remediation webhook received no alert (site.yml starts what is watched first)."""
    poll(lambda: query(host, "up") != [], "Prometheus has scraped")
    assert query(host, 'max_over_time(ALERTS{component="stack", alertname!="Watchdog"}[1h])'
                 ) == []
    assert query(host, "max_over_time(trainwatch_remediation_webhook_alerts_total[1h]) > 0"
                 ) == []


def query(host, promql: str) -> list[dict]:
    from urllib.parse import quote

    body = json.loads(get(host, url("prometheus_port", f"/api/v1/query?query={quote(promql)}")))
    return body["data"]["result"]
