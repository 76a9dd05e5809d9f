"""The whole Trainwatch stack as real processes on free loopback ports, for end-to-end tests.

Prometheus and Alertmanager are the Debian binaries; the training exporter, the GPU exporter
(simulation mode: there is no GPU here), the log scanner and the remediation service are
Trainwatch's own console scripts, started the way the Ansible roles start them. The
Alertmanager config is rendered by the alertmanager role itself (Ansible, render-only) and the
rules are the demo profile, so the test exercises what ships.
"""

from __future__ import annotations

import secrets
import shutil
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from scripts.demo_timeline import torchrun_argv as _torchrun_argv
from tests.support.alertmanager_config import render_one
from tests.support.net import free_port
from tests.support.procs import alertmanager, prometheus, running

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _script(name: str) -> str:
    path = VENV_BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


@dataclass
class Stack:
    """URLs, tokens and paths of a running test stack."""

    workdir: Path
    prometheus: str
    alertmanager: str
    training_exporter: str
    gpu_exporter: str
    logscan: str
    remediation: str
    node_exporter: str | None
    exporter_socket: Path
    control_token_file: Path
    webhook_token: str
    webhook_token_file: Path
    log_dir: Path

    def job_env(self, job: str) -> dict[str, str]:
        """Environment a training job on this 'node' gets (what the Ansible role documents)."""
        return {
            "TRAINWATCH_JOB": job,
            "TRAINWATCH_EXPORTER_SOCKET": str(self.exporter_socket),
            "TRAINWATCH_LOG_DIR": str(self.log_dir),
        }


def _write_secret(path: Path, value: str) -> Path:
    path.write_text(value)
    path.chmod(0o600)
    return path


def render_alertmanager_config(remediation_url: str, token_file: Path, workdir: Path) -> Path:
    """The shipped Alertmanager config, rendered by its role, with the demo timings."""
    return render_one({
        "alertmanager_remediation_enabled": True,
        "alertmanager_remediation_url": remediation_url,
        "alertmanager_remediation_token_file": str(token_file),
        "alertmanager_group_wait": "1s",
        "alertmanager_group_interval": "1s",
        "alertmanager_repeat_interval": "1m",
    }, workdir)


def prometheus_config(targets: dict[str, str], alertmanager_hostport: str) -> str:
    rule_files = sorted(str(p) for p in (REPO / "alert_rules" / "generated" / "demo").glob("*.yml"))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                   "external_labels": {"cluster": "e2e"}},
        "rule_files": rule_files,
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager_hostport]}]}]},
        "scrape_configs": [
            {"job_name": name, "static_configs": [{"targets": [hostport]}]}
            for name, hostport in targets.items()
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


@contextmanager
def running_stack(workdir: Path, *, with_node_exporter: bool = True) -> Iterator[Stack]:
    """Start every part of the stack; stop all of them when the block ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    etc = workdir / "etc"
    etc.mkdir(exist_ok=True)
    log_dir = workdir / "logs"
    log_dir.mkdir(exist_ok=True)
    control_token_file = _write_secret(etc / "control.token", secrets.token_hex(16))
    webhook_token = secrets.token_hex(16)
    webhook_token_file = _write_secret(etc / "webhook.token", webhook_token)
    socket_path = workdir / "training.sock"
    ports = {name: free_port() for name in
             ("training", "gpu", "logscan", "remediation", "node", "alertmanager")}
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}

    with ExitStack() as stack:
        stack.enter_context(running(
            [_script("training-exporter"), "--bind", "127.0.0.1", "--port", str(ports["training"]),
             "--socket", str(socket_path), "--token-file", str(control_token_file),
             "--node", "e2e-node", "--job-expiry-seconds", "10"],
            workdir / "training-exporter.log", ready_url=f"{url['training']}/metrics"))
        stack.enter_context(running(
            [_script("gpu-exporter"), "--bind", "127.0.0.1", "--port", str(ports["gpu"]),
             "--interval", "1", "--simulate", "2"],
            workdir / "gpu-exporter.log", ready_url=f"{url['gpu']}/metrics"))
        stack.enter_context(running(
            [_script("trainwatch-logscan"), "--bind", "127.0.0.1", "--port", str(ports["logscan"]),
             "--state-file", str(workdir / "logscan-state.json"), str(log_dir / "**" / "*.jsonl")],
            workdir / "logscan.log", ready_url=f"{url['logscan']}/metrics"))
        node_url = None
        if with_node_exporter and shutil.which("prometheus-node-exporter"):
            stack.enter_context(running(
                ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{ports['node']}",
                 "--collector.disable-defaults", "--collector.filesystem", "--collector.meminfo",
                 "--collector.cpu", "--collector.loadavg"],
                workdir / "node-exporter.log", ready_url=f"{url['node']}/metrics"))
            node_url = url["node"]

        am_config = render_alertmanager_config(
            f"{url['remediation']}/v1/alerts", webhook_token_file, workdir / "alertmanager-render")
        am_url = stack.enter_context(alertmanager(workdir, am_config, port=ports["alertmanager"]))

        remediation_config = workdir / "remediation.yml"
        remediation_config.write_text(yaml.safe_dump({
            "bind": "127.0.0.1",
            "port": ports["remediation"],
            "webhook_token_file": str(webhook_token_file),
            "store_path": str(workdir / "remediation.sqlite"),
            "prometheus_url": "http://127.0.0.1:1",  # replaced below once Prometheus is up
            "alertmanager_url": am_url,
            "training_exporter_token_file": str(control_token_file),
        }))

        targets = {
            "training": f"127.0.0.1:{ports['training']}",
            "gpu": f"127.0.0.1:{ports['gpu']}",
            "logscan": f"127.0.0.1:{ports['logscan']}",
            "remediation": f"127.0.0.1:{ports['remediation']}",
            "alertmanager": f"127.0.0.1:{ports['alertmanager']}",
        }
        if node_url:
            targets["node"] = f"127.0.0.1:{ports['node']}"
        prom_port = free_port()
        targets["prometheus"] = f"127.0.0.1:{prom_port}"
        prom_config = workdir / "prometheus.yml"
        prom_config.write_text(prometheus_config(targets, f"127.0.0.1:{ports['alertmanager']}"))
        prom_url = stack.enter_context(prometheus(workdir, prom_config, port=prom_port))

        cfg = yaml.safe_load(remediation_config.read_text())
        cfg["prometheus_url"] = prom_url
        remediation_config.write_text(yaml.safe_dump(cfg))
        remediation_config.chmod(0o600)
        stack.enter_context(running(
            [_script("remediation-server"), "--config", str(remediation_config)],
            workdir / "remediation.log", ready_url=f"{url['remediation']}/healthz",
            env={"PYTHONUNBUFFERED": "1"}, cwd=REPO))

        yield Stack(
            workdir=workdir,
            prometheus=prom_url,
            alertmanager=am_url,
            training_exporter=url["training"],
            gpu_exporter=url["gpu"],
            logscan=url["logscan"],
            remediation=url["remediation"],
            node_exporter=node_url,
            exporter_socket=socket_path,
            control_token_file=control_token_file,
            webhook_token=webhook_token,
            webhook_token_file=webhook_token_file,
            log_dir=log_dir,
        )


def torchrun_argv(script: Path, *args: str, nproc: int = 2,
                  master_port: int | None = None) -> list[str]:
    """The demo's torchrun command line, on a free rendezvous port unless one is given."""
    return _torchrun_argv(script, *args, nproc=nproc, master_port=master_port or free_port())
