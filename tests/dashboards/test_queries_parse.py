"""target-promql-rule, for real: every panel query and variable selector is evaluated by a
real Prometheus (an invalid query answers 400 bad_data), with Grafana's variables substituted
the way dashboards.check.panel_queries does for the end-to-end test; and parsed by
promql-parser (the Rust parser Grafana's ecosystem tools use, issue 26), a second parser that
disagrees with Prometheus's on nothing the dashboards may ship."""

from __future__ import annotations

from collections.abc import Iterator

import promql_parser
import pytest
import requests

from dashboards import check
from tests.dashboards.dashboard_files import load_all
from tests.support.procs import prometheus


@pytest.fixture(scope="module")
def prom(real_binaries: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("prom")
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n")
    with prometheus(workdir, config) as url:
        yield url


def _query(url: str, expr: str) -> requests.Response:
    return requests.post(f"{url}/api/v1/query", data={"query": expr}, timeout=10)


def test_an_invalid_query_is_rejected(prom: str) -> None:
    response = _query(prom, "rate(up[$__rate_interval])")
    assert response.status_code == 400 and response.json()["errorType"] == "bad_data"


@pytest.mark.parametrize("name", sorted(load_all()))
def test_every_panel_query_parses(prom: str, name: str) -> None:
    dashboard = load_all()[name]
    queries = check.panel_queries(dashboard) + check.variable_selectors(dashboard)
    assert queries
    bad = []
    for title, expr in queries:
        response = _query(prom, expr)
        if response.status_code != 200:
            bad.append(f"{title}: {response.json().get('error')}\n  {expr}")
    assert not bad, "\n".join(bad)



@pytest.mark.parametrize("name", sorted(load_all()))
def test_every_panel_query_parses_with_promql_parser(name: str) -> None:
    dashboard = load_all()[name]
    queries = check.panel_queries(dashboard) + check.variable_selectors(dashboard)
    bad = []
    for title, expr in queries:
        try:
            promql_parser.parse(expr)
        except ValueError as exc:
            bad.append(f"{title}: {exc}\n  {expr}")
    assert not bad, "\n".join(bad)


def test_promql_parser_refuses_what_prometheus_refuses() -> None:
    with pytest.raises(ValueError):
        promql_parser.parse("rate(up[$__rate_interval])")


@pytest.mark.parametrize("name", sorted(load_all()))
def test_every_annotation_query_parses(prom: str, name: str) -> None:
    bad = []
    queries = check.annotation_queries(load_all()[name])
    for title, expr in queries:
        promql_parser.parse(expr)
        response = _query(prom, expr)
        if response.status_code != 200:
            bad.append(f"{title}: {response.json().get('error')}\n  {expr}")
    assert not bad, "\n".join(bad)
