"""Reusable dashboard checks for tests and the end-to-end suite.

- panel_queries(): every panel's PromQL with Grafana's variables substituted, ready to send
  to Prometheus.
- FAILURE_ONLY: panels that legitimately have no data on a healthy stack, with the reason
  (also listed in dashboards/README.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

# Values for Grafana's built-in interval variables when a query is sent to Prometheus
# directly. $__rate_interval is at least 4x the scrape interval; 1m suits 15s scrapes and
# the 1s demo alike.
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h",
            "__range_s": "3600", "__range_ms": "3600000", "__interval_ms": "15000"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")

# (dashboard uid, panel title) -> why the panel is empty while nothing is wrong
FAILURE_ONLY: dict[tuple[str, str], str] = {
    ("trainwatch-training-job", "CUDA memory"):
        "ranks report CUDA memory only when they run on a GPU; the CPU demo has none",
    ("trainwatch-training-job", "MFU"):
        "MFU needs the rank's peak FLOP/s, known only for the GPUs in exporters/rank/flops.py;"
        " the CPU demo has achieved FLOP/s but no peak (tests/dashboards checks MFU with one)",
    ("trainwatch-training-job", "Log events"):
        "the log scanner's series for a job appear with the first anomaly it finds",
    ("trainwatch-remediation-alerts", "Pending alerts"):
        "an alert is pending only between its condition turning true and its `for` elapsing",
    ("trainwatch-remediation-alerts", "Webhook alerts by outcome"):
        "the outcome series appear with the first webhook call to the remediation service",
    ("trainwatch-remediation-alerts", "Webhook latency p99"):
        "the quantile is NaN until the first webhook call reaches the remediation service",
    ("trainwatch-remediation-alerts", "Decisions"):
        "decisions exist only after an alert with a playbook reached the remediation service",
    ("trainwatch-remediation-alerts", "Actions by result"):
        "actions exist only after a playbook ran",
    ("trainwatch-goodput", "Time to detect by playbook"):
        "observed when a playbook finished acting on a job; the mean is over the rate interval",
    ("trainwatch-goodput", "Time to recover by playbook"):
        "observed when a playbook finished acting on a job; the mean is over the rate interval",
    ("trainwatch-goodput", "Cost of each fault, saved by each healing"):
        "observed when a playbook finished acting on a job",
    ("trainwatch-remediation-alerts", "Intents by state"):
        "intents exist only after an alert with a playbook reached the remediation service",
    ("trainwatch-remediation-alerts", "Lemon nodes"):
        "a node's fault count and interval exist only after the quarantine of that node",
}


def variable_defaults(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """Each template variable's 'All' value (what the dashboard shows on first load); a custom
    variable's current choice."""
    out = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            out[variable["name"]] = variable.get("allValue") or ".+"
        elif variable.get("type") == "custom":
            out[variable["name"]] = str(variable.get("current", {}).get("value", ""))
    return out


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace $var, ${var}, ${var:format} and [[var]]; unknown variables are an error."""
    def replace(match: re.Match[str]) -> str:
        name = match[1] or match[2] or match[3]
        if name not in values:
            raise KeyError(f"query uses undefined variable ${name}: {expr}")
        return values[name]
    return _VARIABLE.sub(replace, expr)


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including panels nested in rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_queries(dashboard: Mapping[str, Any],
                  variables: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """[(panel title, PromQL)] with variables substituted.

    `variables` overrides the dashboard's own 'All' values, e.g. {"training_job": "demo"};
    the datasource variable is not part of any query.
    """
    values = {**BUILTINS, **variable_defaults(dashboard), **(variables or {})}
    return [(panel["title"], substitute(target["expr"], values))
            for panel in panels(dashboard) for target in panel.get("targets", [])
            if target.get("expr")]


def annotation_queries(dashboard: Mapping[str, Any],
                       variables: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """[(annotation name, PromQL)] of the dashboard's Prometheus annotations, substituted as
    panel queries are (Grafana's schema types leave an annotation's `expr` unchecked)."""
    values = {**BUILTINS, **variable_defaults(dashboard), **(variables or {})}
    return [(a["name"], substitute(a["expr"], values))
            for a in dashboard.get("annotations", {}).get("list", [])
            if (a.get("datasource") or {}).get("type") == "prometheus" and a.get("expr")]


def variable_selectors(dashboard: Mapping[str, Any],
                       variables: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """[(variable name, series selector)] of each label_values() variable query."""
    values = {**BUILTINS, **variable_defaults(dashboard), **(variables or {})}
    out = []
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if variable.get("type") == "query" and isinstance(query, str):
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", query.strip())
            if match:
                out.append((variable["name"], substitute(match[1], values)))
    return out
