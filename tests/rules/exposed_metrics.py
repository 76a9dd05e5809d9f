"""Start every exporter for real and collect the metric names they expose.

Used by the cross-check that no rule or panel uses a metric nobody emits. Each exporter is the
real console script or Debian binary on a free loopback port (the GPU exporter in its
simulation mode, since there is no GPU here).
"""

from __future__ import annotations

import re
import secrets
import shutil
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import requests
import yaml

from tests.support.net import free_port, wait_until
from tests.support.procs import alertmanager, prometheus, running

REPO = Path(__file__).resolve().parents[2]
# series Prometheus itself writes for every scrape and alerting rule
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped",
                        "scrape_samples_post_metric_relabeling", "scrape_series_added",
                        "ALERTS", "ALERTS_FOR_STATE"}
_TYPE = re.compile(r"^# TYPE (\S+) (\w+)", re.MULTILINE)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", re.MULTILINE)
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def _script(name: str) -> str:
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def names_in_exposition(text: str) -> set[str]:
    """Metric names of a /metrics page: sample names plus every family's TYPE name (a family
    with no samples yet, e.g. a per-job counter before the first job, still counts)."""
    names = set(_SAMPLE.findall(text))
    for name, kind in _TYPE.findall(text):
        names.add(name)
        names.update(name + suffix for suffix in SUFFIXES.get(kind, ()))
    return names


@contextmanager
def exporters_running(workdir: Path) -> Iterator[dict[str, str]]:
    """Scrape job name -> /metrics URL, for every exporter of the stack, all scraped every
    second by a Prometheus that evaluates the demo rule profile. The training exporter's
    socket is `workdir/training.sock`."""
    workdir.mkdir(parents=True, exist_ok=True)
    token = workdir / "control.token"
    token.write_text(secrets.token_hex(16))
    token.chmod(0o600)
    webhook_token = workdir / "webhook.token"
    webhook_token.write_text(secrets.token_hex(16))
    webhook_token.chmod(0o600)
    ports = {name: free_port() for name in ("training", "gpu", "logscan", "remediation", "node")}
    url = {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}
    with ExitStack() as stack:
        stack.enter_context(running(
            [_script("gpu-exporter"), "--bind", "127.0.0.1", "--port", str(ports["gpu"]),
             "--interval", "1", "--simulate", "2"],
            workdir / "gpu.log", ready_url=url["gpu"]))
        stack.enter_context(running(
            [_script("training-exporter"), "--bind", "127.0.0.1", "--port", str(ports["training"]),
             "--socket", str(workdir / "training.sock"), "--token-file", str(token),
             "--node", "check", "--goodput-zero-seconds", "1"],  # 1 s scrapes
            workdir / "training.log", ready_url=url["training"]))
        (workdir / "logs").mkdir(exist_ok=True)
        stack.enter_context(running(
            [_script("trainwatch-logscan"), "--bind", "127.0.0.1", "--port", str(ports["logscan"]),
             "--state-file", str(workdir / "logscan.json"), str(workdir / "logs" / "*.jsonl")],
            workdir / "logscan.log", ready_url=url["logscan"]))
        stack.enter_context(running(
            ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{ports['node']}"],
            workdir / "node.log", ready_url=url["node"]))
        am_config = workdir / "alertmanager.yml"
        am_config.write_text("route: {receiver: none}\nreceivers: [{name: none}]\n")
        am_url = stack.enter_context(alertmanager(workdir, am_config))
        prom_config = workdir / "prometheus.yml"
        prom_port = free_port()
        targets = {job: u.removeprefix("http://").removesuffix("/metrics")
                   for job, u in url.items()}
        targets["prometheus"] = f"127.0.0.1:{prom_port}"
        targets["alertmanager"] = am_url.removeprefix("http://")
        # Prometheus scrapes every exporter (so metrics created on first use exist, like its
        # own appended-samples counter) and loads the shipped rules with an Alertmanager (so
        # rule-group and notification metrics exist too)
        prom_config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                               for job, target in targets.items()],
            "rule_files": sorted(str(p) for p in
                                 (REPO / "alert_rules" / "generated" / "demo").glob("*.yml")),
            "alerting": {"alertmanagers": [{"static_configs": [
                {"targets": [am_url.removeprefix("http://")]}]}]},
        }))
        prom_url = stack.enter_context(prometheus(workdir, prom_config, port=prom_port))
        remediation_config = workdir / "remediation.yml"
        remediation_config.write_text(yaml.safe_dump({
            "bind": "127.0.0.1", "port": ports["remediation"],
            "webhook_token_file": str(webhook_token),
            "store_path": str(workdir / "remediation.sqlite"),
            "prometheus_url": prom_url, "alertmanager_url": am_url,
            "training_exporter_token_file": str(token),
        }))
        remediation_config.chmod(0o600)
        stack.enter_context(running(
            [_script("remediation-server"), "--config", str(remediation_config)],
            workdir / "remediation.log", ready_url=url["remediation"], cwd=REPO))
        wait_until(lambda: _all_up(prom_url, len(targets)), timeout=30,
                   what="Prometheus to scrape every exporter")
        yield {**url, "prometheus": f"{prom_url}/metrics", "alertmanager": f"{am_url}/metrics"}


def prometheus_base(urls: dict[str, str]) -> str:
    return urls["prometheus"].removesuffix("/metrics")


def _all_up(prom_url: str, count: int) -> bool:
    result = requests.get(f"{prom_url}/api/v1/query", params={"query": "sum(up)"},
                          timeout=5).json()["data"]["result"]
    return bool(result) and float(result[0]["value"][1]) == count


def exposed_names(urls: dict[str, str]) -> dict[str, set[str]]:
    """Scrape job name -> metric names its exporter exposes right now."""
    return {job: names_in_exposition(requests.get(u, timeout=10).text) for job, u in urls.items()}
