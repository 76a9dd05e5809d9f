"""The postgresql role converged for real on this machine (initdb, its postgresql.conf and
pg_hba.conf, the remediation login role and database, a second run changing nothing), and the
remediation role selecting it: the rendered remediation.yml opens the store over TCP with the
password from its 0600 file, and no password reaches the Ansible output or the config."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.ansible.runner import run_playbook
from tests.support.net import free_port
from tests.support.postgres import server_bin
from trainwatch.remediation.config import load_config
from trainwatch.remediation.stores import open_store

CONVERGE = Path(__file__).with_name("converge_postgresql.yml")
PG_ADDRESS = "127.0.0.7"  # the postgresql host's own loopback address
REMEDIATION_ADDRESS = "127.0.0.1"


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A root the unprivileged server user can traverse (pytest's tmp dirs are 0700 root)."""
    root = Path(tempfile.mkdtemp(prefix="trainwatch-pgrole-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        data = root / "pg" / "data" / "postgresql"
        if (data / "postmaster.pid").exists():
            argv = [str(server_bin() / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                    "stop"]
            if os.geteuid() == 0:
                argv = ["runuser", "-u", "nobody", "--", *argv]
            subprocess.run(argv, capture_output=True, timeout=60, check=False)
        shutil.rmtree(root, ignore_errors=True)


def inventory(root: Path, port: int) -> Path:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    path = root / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {
        "postgresql": {"hosts": {"pg-01.cluster.test": {
            **local, "ansible_host": PG_ADDRESS, "trainwatch_prefix": str(root / "pg"),
            "postgresql_port": port}}},
        "remediation": {"hosts": {"mon-01.cluster.test": {
            **local, "ansible_host": REMEDIATION_ADDRESS,
            "trainwatch_prefix": str(root / "mon")}}}}}}))
    return path


@pytest.mark.slow  # two ansible-playbook runs, ~30 s here
@pytest.mark.skipif(server_bin() is None, reason="PostgreSQL server not installed "
                    "(scripts/setup.sh --tests)")
@pytest.mark.skipif(os.geteuid() != 0, reason="runs the server as nobody (needs root here)")
def test_postgresql_role_converges_and_the_remediation_role_uses_it(scratch: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    password = secrets.token_urlsafe(24)
    variables = {
        "trainwatch_service_user": nobody.pw_name,
        "trainwatch_service_group": "nogroup",
        "trainwatch_generate_tokens": True,
        "trainwatch_install_packages": False,
        "trainwatch_postgresql_password": password,
        "remediation_store_backend": "postgresql",
        "remediation_postgresql_sslmode": "disable",
        "postgresql_major": server_bin().parent.name,
        "trainwatch_supervisorctl": ["true"],
    }
    inv = inventory(scratch, free_port())
    first = run_playbook(CONVERGE, variables, scratch, inventory=inv)
    assert first.rc == 0 and first.total("failed") == 0, first.describe()
    assert password not in first.output

    conf_dir = scratch / "pg" / "etc" / "postgresql"
    hba = [line.split() for line in (conf_dir / "pg_hba.conf").read_text().splitlines()
           if line and not line.startswith("#")]
    assert hba == [["local", "all", "nobody", "peer"],
                   ["host", "trainwatch_remediation", "trainwatch_remediation",
                    f"{REMEDIATION_ADDRESS}/32", "scram-sha-256"]]
    assert f"listen_addresses = '{PG_ADDRESS}'" in (conf_dir / "postgresql.conf").read_text()

    etc = scratch / "mon" / "etc"
    config_file = etc / "remediation.yml"
    rendered = yaml.safe_load(config_file.read_text())
    assert rendered["store"]["backend"] == "postgresql"
    assert rendered["store"]["host"] == PG_ADDRESS and rendered["store"]["user"] == \
        "trainwatch_remediation"
    password_file = Path(rendered["store"]["password_file"])
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    assert password_file.read_text() == password and password not in config_file.read_text()

    config = load_config(config_file)  # the service's own loader: the store opens over TCP
    store = open_store(config)
    store.probe_commit()
    assert len(store.store_id()) == 32
    store.close()

    second = run_playbook(CONVERGE, variables, scratch, inventory=inv)
    assert second.rc == 0, second.describe()
    assert second.total("changed") == 0, second.describe()
