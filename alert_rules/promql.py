"""Small PromQL builders shared by the rule modules, so each idiom is written (and fixed) once."""

from __future__ import annotations


def sel(metric: str, *matchers: str) -> str:
    """`metric{m1,m2}` from matcher strings (empty ones skipped)."""
    inner = ",".join(m for m in matchers if m)
    return f"{metric}{{{inner}}}" if inner else metric


def with_node(expr: str) -> str:
    """Add `node` = host part of `instance` (host:port).

    Every Trainwatch exporter on a host is scraped at that host's address, so alerts from
    node_exporter, the GPU exporter and the training exporter on one machine share `node`;
    Alertmanager's inhibition (NodeDown silences that node's GPU and exporter alerts) joins
    on it. Written with an explicit regex so addresses without a port stay untouched.
    """
    return f'label_replace({expr}, "node", "$1", "instance", "(.*):[0-9]+")'


def new_events(series: str, window: str) -> str:
    """Counter `series` went up within `window`, including a series born with a value > 0.

    `increase()` needs two samples, so a counter that first appears already at 1 (the first
    OOM a log scanner ever saw for a job) would be missed; the second branch catches it.
    """
    return f"(increase({series}[{window}]) > 0)\nor\n({series} > 0 unless {series} offset {window})"
