"""Read promtool unit-test files and classify which cases each alert has.

A case is found from the test files alone, by alertname and eval_time:
- firing: an alert_rule_test entry with a non-empty exp_alerts;
- pending ("for" not yet elapsed): an empty alert_rule_test entry at an eval_time where a
  promql_expr_test of the same group expects ALERTS{alertname=...,alertstate="pending"};
- not firing: any other empty alert_rule_test entry (the alert is not even pending there).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

FIRING, PENDING, NOT_FIRING = "firing", "pending", "not firing"
CASES = (FIRING, PENDING, NOT_FIRING)
_PENDING_EXPR = re.compile(r'ALERTS\{alertname="(?P<name>\w+)",alertstate="pending"\}')


@dataclass
class Coverage:
    cases: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def missing(self, alerts: list[str], exempt: dict[str, set[str]]) -> dict[str, list[str]]:
        """Alert -> cases it lacks (ignoring the exempted ones)."""
        out = {}
        for alert in alerts:
            lacking = [c for c in CASES
                       if c not in self.cases.get(alert, set()) and c not in exempt.get(alert, ())]
            if lacking:
                out[alert] = lacking
        return out


def _duration_key(value: Any) -> str:
    return str(value).strip()


def classify(doc: dict[str, Any], coverage: Coverage | None = None) -> Coverage:
    coverage = coverage or Coverage()
    for group in doc.get("tests") or []:
        pending_at: set[tuple[str, str]] = set()
        for expr_test in group.get("promql_expr_test") or []:
            match = _PENDING_EXPR.search(str(expr_test.get("expr", "")))
            if match and expr_test.get("exp_samples"):
                pending_at.add((match["name"], _duration_key(expr_test["eval_time"])))
        for rule_test in group.get("alert_rule_test") or []:
            name = rule_test["alertname"]
            at = _duration_key(rule_test["eval_time"])
            if rule_test.get("exp_alerts"):
                coverage.cases[name].add(FIRING)
            elif (name, at) in pending_at:
                coverage.cases[name].add(PENDING)
            else:
                coverage.cases[name].add(NOT_FIRING)
    return coverage


def classify_files(paths: list[Path]) -> Coverage:
    coverage = Coverage()
    for path in paths:
        classify(yaml.safe_load(path.read_text()), coverage)
    return coverage
