"""The merge filters of the existing modes (ansible/plugins/filter/existing_config.py) on bad
input: a clear error and the site's text unchanged, never an exception out of the filter."""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from tests.ansible.runner import ANSIBLE

_spec = importlib.util.spec_from_file_location(
    "existing_config", ANSIBLE / "plugins" / "filter" / "existing_config.py")
assert _spec is not None and _spec.loader is not None
existing_config = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(existing_config)

TARGETS = "/etc/prometheus/trainwatch/targets"
JOBS = [{"job_name": "gpu", "file_sd_configs": [{"files": [f"{TARGETS}/gpu.json"]}]}]
RENDERED = {"route": {"receiver": "remediation", "routes": [{"receiver": "remediation"}]},
            "receivers": [{"name": "remediation", "webhook_configs": [
                {"url": "https://r:9448/v1/alerts",
                 "http_config": {"authorization": {"credentials_file": "/t/webhook.token"}}}]}]}
LABEL = {"trainwatch": "true"}


@pytest.mark.parametrize("text", ["scrape_configs: [", "- a list\n", "just words"])
def test_a_prometheus_config_that_is_not_a_mapping_is_refused_unchanged(text: str) -> None:
    out = existing_config.prometheus_merge(text, JOBS, "/r/*.yml", TARGETS)
    assert out["error"] and out["text"] == text


def test_prometheus_merge_keeps_the_sites_jobs_and_is_stable() -> None:
    site = yaml.safe_dump({"scrape_configs": [{"job_name": "site", "static_configs": []}]})
    first = existing_config.prometheus_merge(site, JOBS, "/r/*.yml", TARGETS)
    assert first["error"] == ""
    merged = yaml.safe_load(first["text"])
    assert [j["job_name"] for j in merged["scrape_configs"]] == ["site", "gpu"]
    assert merged["rule_files"] == ["/r/*.yml"]
    again = existing_config.prometheus_merge(first["text"], JOBS, "/r/*.yml", TARGETS)
    assert again == {"text": first["text"], "error": ""}


def test_a_site_job_of_trainwatchs_name_is_refused_unchanged() -> None:
    site = yaml.safe_dump({"scrape_configs": [{"job_name": "gpu", "static_configs": []}]})
    out = existing_config.prometheus_merge(site, JOBS, "/r/*.yml", TARGETS)
    assert "already has scrape job(s) gpu" in out["error"] and out["text"] == site


@pytest.mark.parametrize("text", ["receivers: [", "[]", yaml.safe_dump({"receivers": []})])
def test_an_alertmanager_config_without_a_root_route_is_refused_unchanged(text: str) -> None:
    out = existing_config.alertmanager_merge(text, RENDERED, "trainwatch-remediation",
                                             "remediation", LABEL)
    assert out["error"] and out["text"] == text


def test_a_site_receiver_of_trainwatchs_name_is_refused_unchanged() -> None:
    site = yaml.safe_dump({"route": {"receiver": "trainwatch-remediation"},
                           "receivers": [{"name": "trainwatch-remediation",
                                          "email_configs": [{"to": "oncall@example.org"}]}]})
    out = existing_config.alertmanager_merge(site, RENDERED, "trainwatch-remediation",
                                             "remediation", LABEL)
    assert "already has a receiver named trainwatch-remediation" in out["error"]
    assert out["text"] == site


def test_a_rendered_config_without_the_receiver_is_an_error_not_a_crash() -> None:
    site = yaml.safe_dump({"route": {"receiver": "site"}, "receivers": [{"name": "site"}]})
    broken = {**RENDERED, "receivers": []}
    out = existing_config.alertmanager_merge(site, broken, "trainwatch-remediation",
                                             "remediation", LABEL)
    assert "instead of one" in out["error"] and out["text"] == site


def test_alertmanager_merge_routes_trainwatchs_alerts_first_and_passes_them_on() -> None:
    site = yaml.safe_dump({"route": {"receiver": "site", "routes": [{"receiver": "site"}]},
                           "receivers": [{"name": "site"}]})
    out = existing_config.alertmanager_merge(site, RENDERED, "trainwatch-remediation",
                                             "remediation", LABEL)
    merged = yaml.safe_load(out["text"])
    first, second = merged["route"]["routes"]
    assert first == {"receiver": "trainwatch-remediation", "matchers": ['trainwatch="true"'],
                     "continue": True}
    assert second == {"receiver": "site"}
    again = existing_config.alertmanager_merge(out["text"], RENDERED, "trainwatch-remediation",
                                               "remediation", LABEL)
    assert again == {"text": out["text"], "error": ""}

