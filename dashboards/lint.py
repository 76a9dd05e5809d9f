"""The checks of Grafana's dashboard-linter, re-implemented for generated dashboard JSON.

The linter (a Go tool) cannot be installed here, so its rules that matter to Trainwatch are
written out: template-datasource-rule, template-job-rule, template-instance-rule,
target-rate-interval-rule / panel-rate-interval-rule, target-counter-agg-rule,
panel-title-description-rule, panel-units-rule. target-promql-rule (every query parses) is
checked against a real Prometheus in tests/dashboards. Each function returns problems as
human-readable strings; an empty list means the rule passes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dashboards import check, promql_text

Dashboard = Mapping[str, Any]
QUERY_PANELS = {"stat", "singlestat", "graph", "table", "timeseries", "gauge"}
# the subset of the linter's valid unit ids that make sense for Trainwatch's data
VALID_UNITS = {
    "none", "short", "percent", "percentunit", "sci", "bytes", "decbytes", "bits", "Bps",
    "binBps", "s", "ms", "µs", "ns", "m", "h", "d", "dtdurations", "hertz", "ops", "reqps",
    "cps", "watt", "kwatt", "joule", "celsius", "bool", "bool_yes_no", "bool_on_off",
    "dateTimeAsIso", "dateTimeFromNow",
    # computation throughput (Grafana's "FLOP/s" unit), for model FLOP/s
    "flops",
}
DATASOURCE_UIDS = {"$datasource", "${datasource}"}


def _variables(d: Dashboard) -> list[dict[str, Any]]:
    return list(d.get("templating", {}).get("list", []))


def template_datasource(d: Dashboard) -> list[str]:
    found = [v for v in _variables(d) if v.get("type") == "datasource"]
    if not any(v.get("query") == "prometheus" for v in found):
        return [f"{d['title']}: no templated data source"]
    problems = []
    for v in found:
        if v.get("name") not in {"datasource", f"{v.get('query')}_datasource"}:
            problems.append(f"{d['title']}: data source variable named {v.get('name')!r}")
        if v.get("label") not in {"Data source", f"{str(v.get('query')).title()} data source"}:
            problems.append(f"{d['title']}: data source variable labeled {v.get('label')!r}")
        # the Prometheus one, and others only under their own name (the logs' Elasticsearch)
        if v.get("query") != "prometheus" and v.get("name") != f"{v.get('query')}_datasource":
            problems.append(f"{d['title']}: data source variable is not for prometheus")
    return problems


def _template(d: Dashboard, name: str) -> list[str]:
    variable = next((v for v in _variables(d) if v.get("name") == name), None)
    if variable is None:
        return [f"{d['title']}: missing the {name} template"]
    problems = []
    source = variable.get("datasource")
    uid = source.get("uid") if isinstance(source, dict) else source
    if uid not in DATASOURCE_UIDS:
        problems.append(f"{d['title']}: {name} template uses datasource {uid!r}")
    if variable.get("type") != "query":
        problems.append(f"{d['title']}: {name} template is not a query")
    if variable.get("label") != name.title():
        problems.append(f"{d['title']}: {name} template labeled {variable.get('label')!r}")
    if not variable.get("multi"):
        problems.append(f"{d['title']}: {name} template is not multi-select")
    if variable.get("allValue") != ".+":
        problems.append(f"{d['title']}: {name} template allValue {variable.get('allValue')!r}")
    return problems


def template_job(d: Dashboard) -> list[str]:
    return _template(d, "job")


def template_instance(d: Dashboard) -> list[str]:
    return _template(d, "instance")


def _targets(d: Dashboard) -> list[tuple[dict[str, Any], str]]:
    return [(p, t["expr"]) for p in check.panels(d) for t in p.get("targets", [])
            if t.get("expr")]


def rate_interval(d: Dashboard) -> list[str]:
    return [f"{d['title']} / {p['title']}: {fn}() over [{window}] should use $__rate_interval"
            for p, expr in _targets(d)
            for fn, window in promql_text.rate_windows(expr)
            if window != "$__rate_interval"]


def counter_agg(d: Dashboard) -> list[str]:
    return [f"{d['title']} / {p['title']}: counter {name} not inside rate/irate/increase"
            for p, expr in _targets(d) for name in promql_text.unwrapped_counters(expr)]


def title_description(d: Dashboard) -> list[str]:
    return [f"{d['title']}: panel {p.get('id')} lacks a title or description"
            for p in check.panels(d)
            if p.get("type") in QUERY_PANELS and not (p.get("title") and p.get("description"))]


def units(d: Dashboard) -> list[str]:
    problems = []
    for p in check.panels(d):
        if p.get("type") not in QUERY_PANELS:
            continue
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if unit not in VALID_UNITS:
            problems.append(f"{d['title']} / {p.get('title')}: no or invalid unit {unit!r}")
    return problems


RULES: dict[str, Callable[[Dashboard], list[str]]] = {
    "template-datasource-rule": template_datasource,
    "template-job-rule": template_job,
    "template-instance-rule": template_instance,
    "target-rate-interval-rule": rate_interval,
    "target-counter-agg-rule": counter_agg,
    "panel-title-description-rule": title_description,
    "panel-units-rule": units,
}


def lint(d: Dashboard) -> dict[str, list[str]]:
    """Rule name -> problems, only for rules that found some."""
    results = {name: rule(d) for name, rule in RULES.items()}
    return {name: problems for name, problems in results.items() if problems}
