"""Issue 11 item 7: the remediation service, as the role deploys it, runs host playbooks.

The role's tasks (tests/ansible/render_remediation.yml) render the service config, the
inventory of hosts it may act on (from a deploy inventory with two GPU nodes) and the systemd
unit. The test then runs remediation-server the way that unit does: its ExecStart, its
Environment, its WorkingDirectory, and the unit's file-system view: the prefix (the service
user's home) read-only except the unit's ReadWritePaths, through a private mount namespace
(`unshare -m`), which is what ProtectSystem=strict + ReadWritePaths give under systemd. A real
alert for one node then runs the shipped disk-cleanup playbook through ansible-runner on that
node only. Before the fix, Ansible failed on its temp directory under the read-only home, and
the role configured no inventory at all.
"""

from __future__ import annotations

import getpass
import grp
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from tests.ansible.runner import REPO, VENV_BIN, run_playbook
from tests.remediation.helpers import alert, payload
from tests.support.net import free_port, wait_until
from tests.support.procs import running
from trainwatch.remediation.approvers import digest as approver_digest
from trainwatch.remediation.approvers import load_approvers

RENDER = Path(__file__).with_name("render_remediation.yml")
NODES = {"node-a": "node-a.cluster.test", "node-b": "node-b.cluster.test"}
DAY = 86400
APPROVER_TOKEN = "approver-token-for-alice-0123456789abcdef"

# ProtectSystem=strict + ReadWritePaths for the service's own tree: $1 is made read-only, every
# path before `--` writable again, then the service is exec'd in that mount namespace.
NAMESPACE_SCRIPT = """
set -e
mount --make-rprivate /
prefix="$1"; shift
mount --bind "$prefix" "$prefix"
mount -o remount,bind,ro "$prefix"
while [ "$1" != "--" ]; do
  mount --bind "$1" "$1"
  mount -o remount,bind,rw "$1"
  shift
done
shift
exec "$@"
"""


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --make-rprivate / && "
                            "mount -t tmpfs none /mnt"], capture_output=True, check=False)
    return probe.returncode == 0


def _unit(path: Path) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def _node_tree(root: Path) -> None:
    logs = root / "logs"
    logs.mkdir(parents=True)
    old = time.time() - 30 * DAY
    (logs / "old.log").write_bytes(b"x" * 100)
    os.utime(logs / "old.log", (old, old))
    (logs / "new.log").write_bytes(b"y" * 100)


def _deploy_inventory(root: Path) -> Path:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    gpu_nodes = {}
    for short, fqdn in NODES.items():
        data = root / "nodes" / short
        _node_tree(data)
        gpu_nodes[fqdn] = {**local, "trainwatch_python": sys.executable,
                           "trainwatch_cleanup_allowed_roots": [str(data)],
                           "trainwatch_cleanup_log_dirs": [str(data / "logs")]}
    path = root / "deploy-inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {
        "remediation": {"hosts": {"mon-01.cluster.test": dict(local)}},
        "gpu_nodes": {"hosts": gpu_nodes}}}}))
    return path


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -m` with mount rights "
                    "(root in a container that allows mount namespaces) to model the unit")
def test_deployed_service_runs_a_host_playbook_with_a_read_only_home(tmp_path: Path) -> None:
    prefix = tmp_path / "opt" / "trainwatch"
    port = free_port()
    run = run_playbook(RENDER, {
        "trainwatch_prefix": str(prefix),
        "trainwatch_service_user": getpass.getuser(),
        "trainwatch_service_group": grp.getgrgid(os.getgid()).gr_name,
        "trainwatch_generate_tokens": True,
        "trainwatch_bin_dir": str(VENV_BIN),  # the project's virtualenv is this one
        "trainwatch_supervisorctl": ["true"],  # handlers have no supervisord to talk to
        "remediation_port": port,
        "remediation_bind_address": "127.0.0.1",
        "remediation_approvers": {"alice": f"sha256:{approver_digest(APPROVER_TOKEN)}"},
    }, tmp_path, inventory=_deploy_inventory(tmp_path))
    assert run.rc == 0 and run.total("failed") == 0, run.describe()

    config = yaml.safe_load((prefix / "etc" / "remediation.yml").read_text())
    # the host actions' playbooks: the collection's, copied onto the host by the role
    playbooks = Path(config["ansible_playbooks_dir"])
    assert playbooks == prefix / "etc" / "remediation-playbooks"
    assert sorted(p.name for p in playbooks.glob("*.yml")) == sorted(
        p.name for p in (REPO / "ansible" / "playbooks" / "remediation").glob("*.yml"))
    inventory = yaml.safe_load(Path(config["ansible_inventory"]).read_text())
    assert set(inventory["all"]["hosts"]) == set(NODES)  # named as alerts name them
    assert inventory["all"]["hosts"]["node-b"]["ansible_host"] == NODES["node-b"]
    # approvers from the role: digests only, not world-readable, and the service loads them
    approvers_file = Path(config["approvers_file"])
    assert approvers_file.stat().st_mode & 0o777 == 0o640
    assert APPROVER_TOKEN not in approvers_file.read_text()
    assert load_approvers(approvers_file).identify(APPROVER_TOKEN) == "alice"

    unit = _unit(prefix / "trainwatch-remediation.service")
    assert unit["ProtectSystem"] == ["strict"] and unit["ProtectHome"] == ["true"]
    rw_paths = unit["ReadWritePaths"][0].split()
    (prefix / "run").mkdir(exist_ok=True)
    env = {"HOME": str(prefix),  # the service user's home is the prefix: read-only here
           "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    for assignment in unit.get("Environment", []):
        key, _, value = shlex.split(assignment)[0].partition("=")
        env[key] = value
    argv = ["unshare", "-m", "sh", "-c", NAMESPACE_SCRIPT, "sh", str(prefix), *rw_paths, "--",
            *shlex.split(unit["ExecStart"][0])]
    url = f"http://127.0.0.1:{port}"
    token = Path(config["webhook_token_file"]).read_text().strip()
    headers = {"Authorization": f"Bearer {token}"}
    with running(argv, tmp_path / "service.log", ready_url=f"{url}/readyz", env=env,
                 cwd=Path(unit["WorkingDirectory"][0])) as proc:
        # the model holds: nothing can be written in the home, the state dir can
        probe = subprocess.run(["nsenter", "-t", str(proc.pid), "-m", "touch",
                                str(prefix / "probe")], capture_output=True, check=False)
        assert probe.returncode != 0 and not (prefix / "probe").exists()

        firing = alert("NodeDiskFilling", {"node": "node-b", "mountpoint": "/",
                                           "component": "node"})
        resp = requests.post(f"{url}/v1/alerts", json=payload(firing), headers=headers,
                             timeout=10)
        assert resp.status_code < 300, resp.text

        def decided() -> list[dict] | None:
            rows = requests.get(f"{url}/v1/actions", params={"limit": 1000}, headers=headers,
                                timeout=10).json()["audit"]
            mine = [r for r in rows if r["fingerprint"] == firing["fingerprint"]
                    and r["decision"] in ("acted", "failed", "refused")]
            return mine or None

        rows = wait_until(decided, timeout=180, what="the disk cleanup to finish")
        assert [r["decision"] for r in rows] == ["acted"], (rows, proc.log_text()[-3000:])
    nodes = tmp_path / "nodes"
    assert not (nodes / "node-b" / "logs" / "old.log").exists()
    assert (nodes / "node-b" / "logs" / "new.log").exists()
    assert (nodes / "node-a" / "logs" / "old.log").exists()  # the other node: untouched
