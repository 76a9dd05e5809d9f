"""Small PromQL builders shared by the rule modules, so each idiom is written (and fixed) once."""

from __future__ import annotations


def sel(metric: str, *matchers: str) -> str:
    """`metric{m1,m2}` from matcher strings (empty ones skipped)."""
    inner = ",".join(m for m in matchers if m)
    return f"{metric}{{{inner}}}" if inner else metric


HOST_FROM_INSTANCE = "(.*):[0-9]+"


def with_node(expr: str) -> str:
    """Give every series a `node` label: keep the one Prometheus attached (Trainwatch's
    Prometheus role labels every target with the inventory host name, which remediation's
    `--limit` needs), else use the host part of `instance` (host:port).

    Alertmanager's inhibition (NodeDown silences that node's GPU and exporter alerts) joins on
    `node`, so node_exporter, GPU exporter and other exporters on one machine must agree on it:
    either way they do. `node;instance` is joined into a scratch label so the regex only
    matches when `node` is empty; the scratch label is removed again.
    """
    joined = f'label_join({expr}, "tw_node_source", ";", "node", "instance")'
    filled = f'label_replace({joined}, "node", "$1", "tw_node_source", ";{HOST_FROM_INSTANCE}")'
    return f'label_replace({filled}, "tw_node_source", "", "", "")'


def with_host(expr: str) -> str:
    """Add a scratch `host` label = host part of `instance`, for joining series of different
    exporters on one machine (they are scraped at the same address); see without_host."""
    return f'label_replace({expr}, "host", "$1", "instance", "{HOST_FROM_INSTANCE}")'


def without_host(expr: str) -> str:
    return f'label_replace({expr}, "host", "", "", "")'


def new_events(series: str, window: str) -> str:
    """Counter `series` went up within `window`, including a series born with a value > 0.

    `increase()` needs two samples, so a counter that first appears already at 1 (the first
    OOM a log scanner ever saw for a job) would be missed; the second branch catches it.
    """
    return f"(increase({series}[{window}]) > 0)\nor\n({series} > 0 unless {series} offset {window})"
