"""The local inventory deployed for real onto this machine (no systemd: the dedicated
supervisord), converged twice (the second run must change nothing), verified through the
services' own APIs, then stopped with ansible/stop.yml, leaving no process behind.

One module-scoped deployment serves every test here: a converge takes most of a minute on a
busy 2-core box, so the suite does exactly two (plus one check-mode run on a fresh prefix).
"""

from __future__ import annotations

import importlib.util
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from tests.ansible.runner import REPO, PlaybookRun, run_playbook
from tests.support.net import free_port, wait_until

pytestmark = pytest.mark.slow

# The console scripts the roles start (pyproject.toml [project.scripts]).
ENTRY_MODULES = ("exporters.training.server", "exporters.gpu.cli", "exporters.logs.scanner_cli",
                 "remediation.server")
PORT_VARS = ("prometheus_port", "alertmanager_port", "node_exporter_port", "gpu_exporter_port",
             "training_exporter_port", "log_scanner_port", "remediation_port")
EXPECTED_JOBS = {"prometheus", "alertmanager", "node", "gpu", "training", "logscan", "remediation"}


@dataclass
class Deployment:
    prefix: Path
    ports: dict[str, int]
    first: PlaybookRun
    second: PlaybookRun

    def url(self, port_var: str) -> str:
        return f"http://127.0.0.1:{self.ports[port_var]}"


def processes_under(prefix: Path) -> list[str]:
    """Command lines of live processes that mention the deployment prefix."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(prefix) in cmdline:
            found.append(f"{entry.name}: {cmdline.strip()}")
    return found


def missing_entry_modules() -> list[str]:
    return [name for name in ENTRY_MODULES if importlib.util.find_spec(name) is None]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, real_binaries: dict[str, str]
               ) -> Iterator[Deployment]:
    missing = missing_entry_modules()
    if missing:
        pytest.skip(f"console-script modules not built yet: {missing}")
    workdir = tmp_path_factory.mktemp("deploy")
    prefix = workdir / "prefix"
    ports = {name: free_port() for name in PORT_VARS}
    extra_vars = {"trainwatch_prefix": str(prefix), **ports}
    try:
        first = run_playbook("deploy.yml", extra_vars, workdir)
        assert first.rc == 0 and first.total("failed") == 0, first.describe()
        second = run_playbook("deploy.yml", extra_vars, workdir)
        yield Deployment(prefix=prefix, ports=ports, first=first, second=second)
    finally:
        stop = run_playbook("stop.yml", extra_vars, workdir)
        assert stop.rc == 0, stop.describe()
        try:
            wait_until(lambda: not processes_under(prefix), timeout=30,
                       what="every process of the deployment to exit")
        except TimeoutError:
            pytest.fail(f"processes left after stop.yml: {processes_under(prefix)}")


def test_first_converge_changes_and_second_changes_nothing(deployment: Deployment) -> None:
    assert deployment.first.total("changed") > 0, deployment.first.describe()
    second = deployment.second
    assert second.rc == 0 and second.total("failed") == 0, second.describe()
    assert second.total("ok") > 20, second.describe()
    assert second.total("changed") == 0, second.describe()


def test_every_service_answers(deployment: Deployment) -> None:
    for port_var in ("node_exporter_port", "gpu_exporter_port", "training_exporter_port",
                     "log_scanner_port"):
        response = requests.get(f"{deployment.url(port_var)}/metrics", timeout=5)
        assert response.status_code == 200, port_var
    gpu = requests.get(f"{deployment.url('gpu_exporter_port')}/metrics", timeout=5).text
    assert "trainwatch_gpu_exporter_simulated 1" in gpu  # no GPU here: simulate mode is on
    assert requests.get(f"{deployment.url('prometheus_port')}/-/ready", timeout=5).ok
    assert requests.get(f"{deployment.url('alertmanager_port')}/-/ready", timeout=5).ok
    assert requests.get(f"{deployment.url('remediation_port')}/healthz", timeout=5).ok


def test_every_prometheus_target_is_up(deployment: Deployment) -> None:
    url = f"{deployment.url('prometheus_port')}/api/v1/targets"

    def all_up() -> list[dict] | None:
        targets = requests.get(url, timeout=5).json()["data"]["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    targets = wait_until(all_up, timeout=60, interval=0.5, what="every target up")
    assert {t["labels"]["job"] for t in targets} == EXPECTED_JOBS


def test_the_demo_rules_are_loaded(deployment: Deployment) -> None:
    expected = set()
    for path in (REPO / "alert_rules" / "generated" / "demo").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            expected |= {rule["alert"] for rule in group["rules"] if "alert" in rule}
    groups = requests.get(f"{deployment.url('prometheus_port')}/api/v1/rules",
                          timeout=5).json()["data"]["groups"]
    loaded = {rule["name"] for group in groups for rule in group["rules"]
              if rule["type"] == "alerting"}
    assert expected and expected <= loaded


def test_the_watchdog_alert_reaches_alertmanager(deployment: Deployment) -> None:
    url = f"{deployment.url('alertmanager_port')}/api/v2/alerts"

    def watchdog() -> bool:
        return any(a["labels"].get("alertname") == "Watchdog"
                   for a in requests.get(url, timeout=5).json())

    wait_until(watchdog, timeout=60, interval=0.5, what="Watchdog alert in Alertmanager")


def test_secret_files_are_not_world_readable(deployment: Deployment) -> None:
    etc = deployment.prefix / "etc"
    for path in (etc / "control.token", etc / "remediation-webhook.token",
                 etc / "alertmanager" / "alertmanager.yml", etc / "remediation.yml"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == 0o640, f"{path}: {oct(mode)}"
    assert len((etc / "control.token").read_text().strip()) >= 32


def test_tokens_never_reach_the_output(deployment: Deployment) -> None:
    etc = deployment.prefix / "etc"
    for token_file in ("control.token", "remediation-webhook.token"):
        token = (etc / token_file).read_text().strip()
        assert token not in deployment.first.output
        assert token not in deployment.second.output


def test_check_mode_against_a_fresh_host_succeeds(tmp_path: Path,
                                                    real_binaries: dict[str, str]) -> None:
    prefix = tmp_path / "fresh"
    ports = {name: free_port() for name in PORT_VARS}
    run = run_playbook("deploy.yml", {"trainwatch_prefix": str(prefix), **ports}, tmp_path,
                       check=True)
    assert run.rc == 0 and run.total("failed") == 0, run.describe()
    assert run.total("changed") > 0, run.describe()  # it would create the whole stack
    assert not processes_under(prefix)
    assert not os.path.exists(prefix / "venv")  # check mode wrote nothing
