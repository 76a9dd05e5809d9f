"""The shapes of generated rules, and how they serialise to Prometheus rule-file YAML."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainwatch.exporters.contract import catalog

SEVERITIES = ("critical", "warning", "info")
COMPONENTS = ("gpu", "training", "node", "stack")
# The metric part of every recording rule starts with one of Trainwatch's metric prefixes
# (exporters/contract/catalog.py names every family trainwatch_* or training_*), so no recorded name
# can equal one that node-mixin, kube-prometheus-stack or another rule set records in the
# same Prometheus (tests/rules/test_kubernetes.py checks the chart's list).
RECORD_NAMESPACES = ("trainwatch_", "training_")


@dataclass(frozen=True)
class Alert:
    """One alerting rule. Every alert is written for the person paged at night: a summary
    that fits a phone notification and a description that says what to look at first."""

    name: str
    expr: str
    severity: str
    component: str
    summary: str
    description: str
    for_: str | None = None
    keep_firing_for: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.name}: severity {self.severity!r} not in {SEVERITIES}")
        if self.component not in COMPONENTS:
            raise ValueError(f"{self.name}: component {self.component!r} not in {COMPONENTS}")

    def to_dict(self, runbook_base_url: str) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_:
            rule["for"] = self.for_
        if self.keep_firing_for:
            rule["keep_firing_for"] = self.keep_firing_for
        rule["labels"] = {"severity": self.severity, "component": self.component,
                          **catalog.ALERT_LABEL, **self.labels}
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": f"{runbook_base_url}#{self.name.lower()}",
        }
        return rule


@dataclass(frozen=True)
class Record:
    """One recording rule; `name` follows level:metric:operations."""

    name: str
    expr: str
    # Static labels that tell apart several rules recording one name (promtool's
    # duplicate-rules lint compares the name and these labels, not the expression).
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name.count(":") != 2:
            raise ValueError(f"recording rule {self.name!r} must be level:metric:operations")
        if not self.name.split(":")[1].startswith(RECORD_NAMESPACES):
            raise ValueError(f"recording rule {self.name!r}: its metric part must start with "
                             f"one of {RECORD_NAMESPACES} (name-spaced)")

    def to_dict(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"record": self.name, "expr": self.expr}
        if self.labels:
            rule["labels"] = dict(self.labels)
        return rule


@dataclass(frozen=True)
class Group:
    """A rule group; `interval` None = Prometheus's global evaluation interval."""

    name: str
    rules: list[Alert] | list[Record] | list[Alert | Record]
    interval: str | None = None

    def to_dict(self, runbook_base_url: str) -> dict[str, Any]:
        return {
            "name": self.name,
            **({"interval": self.interval} if self.interval else {}),
            "rules": [
                r.to_dict(runbook_base_url) if isinstance(r, Alert) else r.to_dict()
                for r in self.rules
            ],
        }


def alert_groups(component: str, alerts: list[Alert],
                 interval_of: Callable[[str | None], str | None],
                 suffix_of: Callable[[str | None], str]) -> list[Group]:
    """`trainwatch-<component>.alerts` at the global interval and, for the alerts whose
    `for` is long enough (interval_of gives them an interval), `trainwatch-<component>
    <suffix>.alerts` at that interval (`-medium`: 30 s, `-slow`: 1 m in production):
    Prometheus evaluates them a half or a quarter as often."""
    by_interval: dict[str | None, list[Alert]] = {}
    for alert in alerts:
        by_interval.setdefault(interval_of(alert.for_), []).append(alert)
    return [Group(f"trainwatch-{component}{suffix_of(interval)}.alerts", rules, interval)
            for interval, rules in sorted(by_interval.items(),
                                          key=lambda kv: (kv[0] is not None, suffix_of(kv[0])))]
