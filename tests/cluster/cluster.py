"""The loopback cluster (ansible/inventories/loopback-cluster) converged for real, and torn down.

Every host of the inventory is its own loopback address with its own prefix under one root
and its own dedicated supervisord. The test overrides only the root (a fresh temporary
directory) and the ports (one per service, free on every host address), as extra-vars, so the
committed inventory is what converges.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml

from tests.ansible.runner import ANSIBLE, SITE, PlaybookRun, run_playbook
from tests.ansible.test_local_deploy import processes_under
from tests.support.net import free_port, wait_until

INVENTORY = ANSIBLE / "inventories" / "loopback-cluster"
PORT_VARS = ("prometheus_port", "alertmanager_port", "alertmanager_cluster_port",
             "node_exporter_port", "gpu_exporter_port", "training_exporter_port",
             "log_scanner_port", "remediation_port", "postgresql_port")

# The services the inventory runs with TLS (trainwatch_tls): they carry a token or an action.
TLS_PORT_VARS = ("training_exporter_port", "remediation_port")


@dataclass(frozen=True)
class Host:
    """One 'machine' of the cluster: its inventory name, address, groups and prefix."""

    name: str
    address: str
    groups: frozenset[str]
    prefix: Path

    def supervisorctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["supervisorctl", "-c", str(self.prefix / "etc" / "supervisord.conf"),
                               *args], capture_output=True, text=True, timeout=timeout,
                              check=False)

    def pid(self, program: str) -> int:
        """The pid supervisord gives for one of this host's programs."""
        out = self.supervisorctl("pid", program).stdout.strip()
        if not out.isdigit() or int(out) == 0:
            raise RuntimeError(f"{self.name}: {program} is not running ({out!r})")
        return int(out)

    def supervisord_pid(self) -> int | None:
        path = self.prefix / "run" / "supervisord.pid"
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None


@dataclass
class Cluster:
    root: Path
    hosts: dict[str, Host]
    ports: dict[str, int]
    runs: list[PlaybookRun] = field(default_factory=list)

    def group(self, name: str) -> list[Host]:
        return [h for h in self.hosts.values() if name in h.groups]

    def url(self, host: Host, port_var: str) -> str:
        scheme = "https" if port_var in TLS_PORT_VARS else "http"
        return f"{scheme}://{host.address}:{self.ports[port_var]}"

    @property
    def ca_file(self) -> str:
        """The CA the deploy created on the controller (trainwatch_tls_ca_dir)."""
        return str(self.root / "controller" / "tls" / "ca.pem")

    def secret(self, name: str) -> str:
        """A shared secret the inventory generated on the controller (webhook.token, ...)."""
        return (self.root / "controller" / name).read_text().strip()

    def extra_vars(self) -> dict[str, object]:
        return {"trainwatch_cluster_root": str(self.root), **self.ports}

    def converge(self, workdir: Path) -> PlaybookRun:
        run = run_playbook(SITE, self.extra_vars(), workdir, inventory=INVENTORY,
                           timeout=1200)
        self.runs.append(run)
        return run

    def kill_host(self, host: Host) -> list[int]:
        """kill -9 a whole host: its supervisord first (so nothing is restarted), then every
        process of its prefix. Returns the pids killed."""
        killed = []
        pid = host.supervisord_pid()
        if pid:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        for other in _pids_under(host.prefix):
            with contextlib.suppress(ProcessLookupError):
                os.kill(other, signal.SIGKILL)
                killed.append(other)
        wait_until(lambda: not processes_under(host.prefix), timeout=30,
                   what=f"every process of {host.name} gone")
        return killed

    def teardown(self) -> list[str]:
        """supervisorctl shutdown on every host, then SIGKILL whatever is left under the root.
        Returns what had to be killed."""
        for host in self.hosts.values():
            if host.supervisord_pid():
                host.supervisorctl("shutdown")
        return kill_what_is_left(self.root, "every process of the cluster to exit")


def kill_what_is_left(root: Path, what: str, timeout: float = 60) -> list[str]:
    """Wait for every process under `root` to exit; SIGKILL whatever has not by `timeout`,
    and return what that was (a teardown that had to kill is worth reporting)."""
    try:
        wait_until(lambda: not processes_under(root), timeout=timeout, what=what)
        return []
    except TimeoutError:
        left = processes_under(root)
        for pid in _pids_under(root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left


def _pids_under(prefix: Path) -> list[int]:
    return [int(line.split(":", 1)[0]) for line in processes_under(prefix)]


def inventory_hosts(root: Path) -> dict[str, Host]:
    """Hosts, addresses and groups as the committed inventory names them."""
    doc = yaml.safe_load((INVENTORY / "hosts.yml").read_text())["all"]
    groups: dict[str, set[str]] = {name: set() for name in doc["hosts"]}
    for group, body in doc["children"].items():
        for name in (body.get("hosts") or {}):
            groups[name].add(group)
    return {name: Host(name=name, address=str(hv["ansible_host"]),
                       groups=frozenset(groups[name]), prefix=root / name)
            for name, hv in doc["hosts"].items()}


def free_port_on(addresses: list[str]) -> int:
    """A port free on 127.0.0.1 (so on no wildcard bind) and on every host address."""
    while True:
        port = free_port()
        try:
            for address in addresses:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind((address, port))
        except OSError:
            continue
        return port


def new_cluster() -> Cluster:
    """A fresh root (0755: db-01's server user must traverse it) and free ports."""
    root = Path(tempfile.mkdtemp(prefix="trainwatch-cluster-"))
    root.chmod(0o755)
    hosts = inventory_hosts(root)
    addresses = [h.address for h in hosts.values()]
    return Cluster(root=root, hosts=hosts,
                   ports={name: free_port_on(addresses) for name in PORT_VARS})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def get_json(url: str, **kwargs: object) -> object:
    resp = requests.get(url, timeout=5, **kwargs)  # type: ignore[arg-type]
    resp.raise_for_status()
    return resp.json()
