"""No rule and no dashboard panel uses a metric that nobody emits.

Every metric name in the generated rules (both profiles) and in every dashboard query and
variable is checked against what the real exporters expose when started here: the GPU
exporter (simulation mode), training exporter, log scanner, remediation service,
node_exporter, Prometheus and Alertmanager; plus the series Prometheus writes itself (up,
ALERTS, ...) and the recording rules' own names.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from dashboards import check, promql_text
from tests.dashboards.dashboard_files import load_all
from tests.rules.exposed_metrics import (
    PROMETHEUS_SYNTHETIC,
    exporters_running,
    exposed_names,
    names_in_exposition,
)
from tests.rules.rulefiles import PROFILES, dcgm_field_names, exprs, rules
from tests.support import metric_table


@pytest.fixture(scope="module")
def exporter_urls(real_binaries: dict[str, str],
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with exporters_running(tmp_path_factory.mktemp("exporters")) as urls:
        yield urls


@pytest.fixture(scope="module")
def exposed(exporter_urls: dict[str, str]) -> dict[str, set[str]]:
    return exposed_names(exporter_urls)


@pytest.mark.parametrize("exporter", ["gpu", "training", "logscan", "remediation"])
def test_trainwatch_exporters_serve_their_table_rows(exporter_urls: dict[str, str],
                                                     exporter: str) -> None:
    """Name, type, HELP text and labels of every family as the metric table says."""
    page = requests.get(exporter_urls[exporter], timeout=10).text
    assert metric_table.mismatches(page, exporter, complete=False) == []


def recorded_names() -> set[str]:
    return {r["record"] for p in PROFILES for r in rules(p) if "record" in r}


def used_by_rules() -> dict[str, set[str]]:
    return {expr: promql_text.metric_names(expr) for p in PROFILES for expr in exprs(p)}


def used_by_dashboards() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, dashboard in load_all().items():
        pairs = check.panel_queries(dashboard) + check.variable_selectors(dashboard)
        for title, expr in pairs:
            out[f"{name} / {title}: {expr}"] = promql_text.metric_names(expr)
    return out


def _unknown(used: dict[str, set[str]], known: set[str]) -> list[str]:
    return [f"{sorted(names - known)} in {where}" for where, names in used.items()
            if names - known]


def test_every_exporter_exposes_something(exposed: dict[str, set[str]]) -> None:
    for job, names in exposed.items():
        assert names, f"{job} exposed no metrics"
    assert "trainwatch_gpu_up" in exposed["gpu"]
    assert "training_loss" in exposed["training"]
    assert "node_filesystem_avail_bytes" in exposed["node"]


def test_rules_use_only_exposed_metrics(exposed: dict[str, set[str]]) -> None:
    # the dcgm profile reads dcgm-exporter's fields, which nothing here can expose
    known = (set().union(*exposed.values()) | PROMETHEUS_SYNTHETIC | recorded_names()
             | dcgm_field_names())
    assert not _unknown(used_by_rules(), known)


def test_dashboards_use_only_exposed_metrics(exposed: dict[str, set[str]]) -> None:
    known = set().union(*exposed.values()) | PROMETHEUS_SYNTHETIC | recorded_names()
    assert not _unknown(used_by_dashboards(), known)


def test_the_cross_check_notices_an_unknown_metric() -> None:
    used = {"x": promql_text.metric_names('rate(trainwatch_gpu_made_up_total{gpu="0"}[5m])')}
    assert _unknown(used, {"up"}) == ["['trainwatch_gpu_made_up_total'] in x"]


def test_names_in_exposition_reads_empty_families() -> None:
    text = "# HELP a_seconds x\n# TYPE a_seconds histogram\n# TYPE b_total counter\nc 1\n"
    assert names_in_exposition(text) == {"a_seconds", "a_seconds_bucket", "a_seconds_sum",
                                         "a_seconds_count", "b_total", "c"}


def test_metric_name_extraction() -> None:
    expr = ('sum by (job) (rate(foo_total{a="b"}[$__rate_interval])) / on (x) group_left () '
            'bar offset 5m > 1e-3 and time() - baz:rec:ratio unless label_replace(q, "a", '
            '"$1", "b", "(.*)")')
    assert promql_text.metric_names(expr) == {"foo_total", "bar", "baz:rec:ratio", "q"}
