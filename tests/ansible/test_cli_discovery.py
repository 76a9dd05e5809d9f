"""The operator CLI finds the deployment it belongs to: the remediation role writes the
addresses of Prometheus, Alertmanager and the remediation service into the CLI's own
environment (etc/trainwatch/cli.yml of the services' virtualenv), and `trainwatch status` and
`trainwatch silences` there reach them with no flag, no variable and no token.

Real parts: the role's own tasks (tests/ansible/render_remediation.yml, render-only), a real
Prometheus and Alertmanager on the ports the inventory gives the monitoring host, and the CLI
run by a virtualenv at the deploy's venv path. Before: the CLI knew only the built-in ports
(`Prometheus unreachable at http://127.0.0.1:9090` after the demo) and `status` without a token
exited 2.
"""

from __future__ import annotations

import getpass
import grp
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

from tests.ansible.runner import run_playbook
from tests.support.net import free_port
from tests.support.procs import alertmanager, prometheus

RENDER = Path(__file__).with_name("render_remediation.yml")
pytestmark = pytest.mark.slow  # one ansible-playbook run, a Prometheus and an Alertmanager


def _inventory(root: Path, prometheus_port: int, alertmanager_port: int) -> Path:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    path = root / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {
        "remediation": {"hosts": {"ops-01": dict(local)}},
        "monitoring": {"hosts": {"mon-01": {**local, "trainwatch_scrape_address": "127.0.0.1",
                                            "prometheus_port": prometheus_port,
                                            "alertmanager_port": alertmanager_port}}}}}}))
    return path


def _venv_at(path: Path) -> Path:
    """A virtualenv at the deploy's venv path that imports this checkout's packages."""
    venv.EnvBuilder(with_pip=False).create(path)
    site = next(path.glob("lib/python3*/site-packages"))
    # addsitedir, not a bare path: it also runs that directory's .pth files, among them the
    # editable install's finder that maps trainwatch.* onto the checkout
    (site / "checkout.pth").write_text("".join(
        f"import site; site.addsitedir({p!r})\n" for p in sys.path if p.endswith("site-packages")))
    return path / "bin" / "python"


def test_the_cli_reads_the_addresses_the_deploy_wrote(tmp_path: Path) -> None:
    prefix = tmp_path / "opt" / "trainwatch"
    prom_port, am_port, remediation_port = free_port(), free_port(), free_port()
    run = run_playbook(RENDER, {
        "trainwatch_prefix": str(prefix),
        "trainwatch_service_user": getpass.getuser(),
        "trainwatch_service_group": grp.getgrgid(os.getgid()).gr_name,
        "trainwatch_generate_tokens": True,
        "trainwatch_supervisorctl": ["true"],
        "remediation_port": remediation_port,
        "remediation_bind_address": "0.0.0.0",
    }, tmp_path, inventory=_inventory(tmp_path, prom_port, am_port), limit="remediation")
    assert run.rc == 0 and run.total("failed") == 0, run.describe()
    written = prefix / "venv" / "etc" / "trainwatch" / "cli.yml"
    assert yaml.safe_load(written.read_text()) == {
        "prometheus_url": f"http://127.0.0.1:{prom_port}",
        "alertmanager_url": f"http://127.0.0.1:{am_port}",
        "remediation_url": f"http://127.0.0.1:{remediation_port}"}

    python = _venv_at(prefix / "venv")
    prom_config = tmp_path / "prometheus.yml"
    prom_config.write_text(yaml.safe_dump({"global": {"scrape_interval": "15s"}}))
    am_config = tmp_path / "am.yml"
    am_config.write_text(yaml.safe_dump({"route": {"receiver": "none"},
                                         "receivers": [{"name": "none"}]}))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")}  # no ~/.config, no TRAINWATCH_*
    cli = [str(python), "-m", "trainwatch.remediation.operator"]
    with prometheus(tmp_path, prom_config, port=prom_port), \
            alertmanager(tmp_path, am_config, port=am_port):
        status = subprocess.run([*cli, "status"], capture_output=True, text=True, env=env,
                                timeout=60, check=False)
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert lines[0] == f"JOBS (Prometheus http://127.0.0.1:{prom_port})"
        assert lines[1] == "(none)"
        assert lines[-1].startswith("(no token: set TRAINWATCH_TOKEN_FILE"), lines
        silences = subprocess.run([*cli, "silences"], capture_output=True, text=True, env=env,
                                  timeout=60, check=False)
        assert (silences.returncode, silences.stdout.strip()) == (0, "(none)"), silences.stderr
