"""Issue 11 item 8: the Alertmanager API is not open to the network by default.

The real role tasks (tests/ansible/render_alerting.yml) render Prometheus's and Alertmanager's
configs, the web config and the clients' credentials; the test runs the real Alertmanager 0.25
(Debian prometheus-alertmanager), Prometheus and amtool with exactly what was rendered.
Before the fix the role bound the API to 0.0.0.0 with no authentication, so anyone on the
network could post alerts that reach the remediation webhook with Alertmanager's valid token.
"""

from __future__ import annotations

import getpass
import grp
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from tests.ansible.runner import run_playbook
from tests.remediation.helpers import write_config
from tests.support.net import free_port, wait_until
from tests.support.procs import running
from trainwatch.remediation.actions import silence
from trainwatch.remediation.actions.base import ActionContext, ActionError
from trainwatch.remediation.config import load_config

RENDER = Path(__file__).with_name("render_alerting.yml")
PASSWORD = "alertmanager-test-password-" + "c" * 12
ALERT = [{"labels": {"alertname": "PostedFromTheNetwork", "severity": "warning"},
          "annotations": {"summary": "test"}}]


def _non_loopback_address() -> str | None:
    """An address of this machine that is not loopback (where a network client would come)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.123", 9))  # TEST-NET: nothing is sent, a route is chosen
        except OSError:
            return None
        address = sock.getsockname()[0]
    return None if address.startswith("127.") else address


def _render(root: Path, **extra: object):  # -> (PlaybookRun, prefix, ports)
    prefix = root / "opt" / "trainwatch"
    inventory = root / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"monitoring": {"hosts": {
        "mon-01": {"ansible_connection": "local",
                   "ansible_python_interpreter": sys.executable}}}}}}))
    ports = {"alertmanager_port": free_port(), "prometheus_port": free_port()}
    run = run_playbook(RENDER, {
        "trainwatch_prefix": str(prefix),
        "trainwatch_service_user": getpass.getuser(),
        "trainwatch_service_group": grp.getgrgid(os.getgid()).gr_name,
        "trainwatch_scrape_address": "127.0.0.1",
        "trainwatch_generate_tokens": True,
        "trainwatch_supervisorctl": ["true"],
        "alertmanager_amtool_config_file": str(root / "home/.config/prometheus/amtool.yml"),
        "alertmanager_group_wait": "1s", "alertmanager_group_interval": "1s",
        "prometheus_evaluation_interval": "1s", "prometheus_resend_delay": "1s",
        **ports, **extra}, root, inventory=inventory)
    return run, prefix, ports


def _argv(prefix: Path) -> dict[str, list[str]]:
    return json.loads((prefix / "argv.json").read_text())


def test_default_binds_the_api_to_loopback(tmp_path: Path) -> None:
    run, prefix, ports = _render(tmp_path)
    assert run.rc == 0, run.describe()
    argv = _argv(prefix)["alertmanager"]
    port = ports["alertmanager_port"]
    assert f"--web.listen-address=127.0.0.1:{port}" in argv
    with running(argv, tmp_path / "am.log", ready_url=f"http://127.0.0.1:{port}/-/ready"):
        address = _non_loopback_address()
        if address is not None:  # a client on the network cannot even connect
            with pytest.raises(requests.ConnectionError):
                requests.post(f"http://{address}:{port}/api/v2/alerts", json=ALERT, timeout=5)


def test_network_bind_without_a_credential_is_refused(tmp_path: Path) -> None:
    run, prefix, _ = _render(tmp_path, alertmanager_bind_address="0.0.0.0")
    assert run.rc != 0
    assert "opens the Alertmanager API to the network without a credential" in run.output
    assert not (prefix / "argv.json").exists()


@pytest.mark.slow
def test_network_bind_requires_basic_auth_and_prometheus_and_amtool_still_reach_it(
        tmp_path: Path) -> None:
    run, prefix, ports = _render(tmp_path, alertmanager_bind_address="0.0.0.0",
                                 trainwatch_alertmanager_password=PASSWORD)
    assert run.rc == 0, run.describe()
    assert PASSWORD not in run.output
    web = yaml.safe_load((prefix / "etc/alertmanager/web.yml").read_text())
    assert web["basic_auth_users"]["trainwatch"].startswith("$2")  # bcrypt, never the password
    argvs = _argv(prefix)
    am_port, prom_port = ports["alertmanager_port"], ports["prometheus_port"]
    am_url = f"http://127.0.0.1:{am_port}"
    (prefix / "etc/prometheus/rules/always.yml").write_text(yaml.safe_dump({"groups": [{
        "name": "always", "rules": [{"alert": "AlwaysFiring", "expr": "vector(1)",
                                     "labels": {"severity": "info"}}]}]}))
    home = tmp_path / "home"

    def amtool(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["amtool", *args], capture_output=True, text=True, check=False,
                              env={**os.environ, "HOME": str(home)}, timeout=30)

    with running(argvs["alertmanager"], tmp_path / "am.log"):
        wait_until(lambda: requests.get(f"{am_url}/-/ready", timeout=2).status_code == 401
                   or None, timeout=30, what="Alertmanager to answer")
        # a client without the credential is refused, on every address the API listens on
        addresses = ["127.0.0.1", *filter(None, [_non_loopback_address()])]
        for address in addresses:
            resp = requests.post(f"http://{address}:{am_port}/api/v2/alerts", json=ALERT,
                                 timeout=5)
            assert resp.status_code == 401, (address, resp.status_code)
        resp = requests.post(f"{am_url}/api/v2/alerts", json=ALERT, timeout=5,
                             auth=("trainwatch", "wrong-password"))
        assert resp.status_code == 401
        # amtool, configured by the role, gets in
        query = amtool("alert", "query", "-o", "json")
        assert query.returncode == 0, query.stderr
        assert "PostedFromTheNetwork" not in query.stdout  # nothing unauthenticated got in
        # the remediation service's silences carry the credential (and fail without it)
        for with_auth in (False, True):
            extra = {"alertmanager_password_file":
                     str(prefix / "etc/alertmanager/client.password")} if with_auth else {}
            config = load_config(write_config(tmp_path / f"svc-{with_auth}",
                                              alertmanager_url=am_url, **extra))
            ctx = ActionContext(config=config, labels={"alertname": "X", "node": "n1"},
                                idempotency_key="k", session=requests.Session())
            if with_auth:
                assert silence.run({"action": "silence", "duration": "5m"}, ctx)["silence_id"]
            else:
                with pytest.raises(ActionError, match="401"):
                    silence.run({"action": "silence", "duration": "5m"}, ctx)
        # Prometheus, with the rendered alerting config, delivers its alerts
        with running(argvs["prometheus"], tmp_path / "prom.log",
                     ready_url=f"http://127.0.0.1:{prom_port}/-/ready"):
            def delivered() -> bool | None:
                out = amtool("alert", "query", "alertname=AlwaysFiring", "-o", "json")
                return (out.returncode == 0 and "AlwaysFiring" in out.stdout) or None

            wait_until(delivered, timeout=90, what="Prometheus's alert to reach Alertmanager")
