"""The site playbook beside a site's own Prometheus, Alertmanager and node_exporter (issue 38,
"use mine"): prometheus_mode, alertmanager_mode and node_exporter_mode `existing`.

The test plays the site: Debian's own prometheus, prometheus-alertmanager and
prometheus-node-exporter with configs of their own (one job, one receiver). The collection's
site playbook then runs against localhost with the Python services switched off (no
virtualenv to build): it must start no server of its own, keep the site's job and receiver,
and leave Trainwatch's jobs, rules and receiver loaded in the running servers, read back over
their HTTP APIs. A second run changes nothing; a site job with a Trainwatch job's name fails the
run with a clear message and the live file byte-identical.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from tests.ansible.runner import SITE, run_playbook
from tests.ansible.test_local_deploy import processes_under
from tests.support.net import free_port, wait_until
from tests.support.procs import alertmanager, prometheus, running

pytestmark = pytest.mark.slow

# The prometheus role alone, for the clash run (the site playbook's other plays cost CPU).
PROMETHEUS_ONLY = Path(__file__).with_name("prometheus_existing.yml")
SITE_JOB = {"job_name": "site-own", "static_configs": [{"targets": []}]}
SITE_RECEIVER = "site-oncall"


@dataclass
class Site:
    """The site's own servers and the files the playbook works on."""

    prometheus_url: str
    alertmanager_url: str
    node_exporter_port: int
    prometheus_config: Path
    alertmanager_config: Path
    etc: Path


def site_prometheus_config(jobs: list[dict]) -> str:
    return "# the site's own comment\n" + yaml.safe_dump(
        {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
         "scrape_configs": jobs}, sort_keys=False)


@pytest.fixture
def site(tmp_path: Path, real_binaries: dict[str, str]) -> Iterator[Site]:
    etc = tmp_path / "site-etc"
    etc.mkdir()
    prom_config = etc / "prometheus.yml"
    prom_config.write_text(site_prometheus_config([SITE_JOB]))
    am_config = etc / "alertmanager.yml"
    am_config.write_text(yaml.safe_dump({"route": {"receiver": SITE_RECEIVER},
                                         "receivers": [{"name": SITE_RECEIVER}]}))
    node_port = free_port()
    node_argv = ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{node_port}",
                 "--collector.disable-defaults", "--collector.loadavg"]
    with running(node_argv, tmp_path / "node-exporter.log",
                 ready_url=f"http://127.0.0.1:{node_port}/metrics"), \
            alertmanager(tmp_path, am_config) as am_url, \
            prometheus(tmp_path, prom_config) as prom_url:
        yield Site(prom_url, am_url, node_port, prom_config, am_config, etc)


def site_vars(tmp_path: Path, site: Site) -> dict:
    return {
        "trainwatch_prefix": str(tmp_path / "prefix"),
        # Only Prometheus, Alertmanager and node_exporter, all the site's: no Python service,
        # so no virtualenv, and no service manager is ever asked to run anything.
        "trainwatch_venv_enabled": False,
        "trainwatch_install_packages": False,
        "trainwatch_service_manager": "systemd",
        **{f"{role}_enabled": False for role in
           ("gpu_exporter", "training_exporter", "log_scanner", "remediation")},
        "node_exporter_mode": "existing",
        "node_exporter_port": site.node_exporter_port,
        "prometheus_mode": "existing",
        "prometheus_port": int(site.prometheus_url.rsplit(":", 1)[1]),
        "prometheus_existing_config": str(site.prometheus_config),
        "prometheus_existing_rules_dir": str(site.etc / "trainwatch" / "rules"),
        "prometheus_existing_targets_dir": str(site.etc / "trainwatch" / "targets"),
        "prometheus_existing_reload": "url",
        "alertmanager_mode": "existing",
        "alertmanager_port": int(site.alertmanager_url.rsplit(":", 1)[1]),
        "alertmanager_existing_config": str(site.alertmanager_config),
        "alertmanager_existing_token_file": str(site.etc / "trainwatch" / "webhook.token"),
        "alertmanager_existing_token_group": "root",
    }


def loaded_jobs(url: str) -> set[str]:
    config = requests.get(f"{url}/api/v1/status/config", timeout=5).json()["data"]["yaml"]
    return {job["job_name"] for job in yaml.safe_load(config)["scrape_configs"]}


def node_up(url: str) -> bool:
    result = requests.get(f"{url}/api/v1/query", params={"query": 'up{job="node"}'},
                          timeout=5).json()["data"]["result"]
    return bool(result) and all(sample["value"][1] == "1" for sample in result)


def test_site_playbook_beside_the_sites_own_monitoring(tmp_path: Path, site: Site) -> None:
    extra = site_vars(tmp_path, site)
    first = run_playbook(SITE, extra, tmp_path)
    assert first.rc == 0 and first.total("failed") == 0, first.describe()
    assert not processes_under(tmp_path / "prefix")  # no server of Trainwatch's own

    # The site's job and Trainwatch's, in the running server; Trainwatch's rules evaluated.
    jobs = loaded_jobs(site.prometheus_url)
    assert {"site-own", "prometheus", "alertmanager", "node"} <= jobs, jobs
    groups = requests.get(f"{site.prometheus_url}/api/v1/rules",
                          timeout=5).json()["data"]["groups"]
    assert any(group["name"].startswith("trainwatch-") for group in groups)
    wait_until(lambda: node_up(site.prometheus_url), timeout=30,
               what="the site's node_exporter scraped by Trainwatch's node job")

    # The site's receiver and Trainwatch's, in the running Alertmanager; Trainwatch's route
    # first, matched by the label every Trainwatch rule carries, passing alerts on.
    status = requests.get(f"{site.alertmanager_url}/api/v2/status", timeout=5).json()
    config = yaml.safe_load(status["config"]["original"])
    assert {r["name"] for r in config["receivers"]} == {SITE_RECEIVER, "trainwatch-remediation"}
    assert config["route"]["receiver"] == SITE_RECEIVER
    labelled = [route for route in config["route"]["routes"]
                if 'trainwatch="true"' in route.get("matchers", [])]
    assert labelled and labelled[0]["continue"] is True, config["route"]
    assert config["route"]["routes"] == [config["route"]["routes"][0], labelled[0]]  # fast, then it
    [hook] = next(r for r in config["receivers"]
                  if r["name"] == "trainwatch-remediation")["webhook_configs"]
    assert hook["http_config"]["authorization"]["credentials_file"] == \
        extra["alertmanager_existing_token_file"]
    assert (site.etc / "trainwatch" / "webhook.token").stat().st_mode & 0o777 == 0o640

    # Nothing to change, so no reload either (a reload always reports a change).
    second = run_playbook(SITE, extra, tmp_path)
    assert second.rc == 0 and second.total("changed") == 0, second.describe()

    # A site job named like one of Trainwatch's: a clear failure, the live file untouched.
    site.prometheus_config.write_text(site_prometheus_config(
        [SITE_JOB, {"job_name": "node", "static_configs": [{"targets": ["127.0.0.1:1"]}]}]))
    before = site.prometheus_config.read_bytes()
    clash = run_playbook(PROMETHEUS_ONLY, extra, tmp_path)
    assert clash.rc != 0, clash.describe()
    assert "already has scrape job(s) node that Trainwatch did not write" in clash.output
    assert site.prometheus_config.read_bytes() == before
