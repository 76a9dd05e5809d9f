"""Paths and parsed contents of the generated rule files, shared by the rule tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from exporters import catalog

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "alert_rules"
GENERATED = RULES_DIR / "generated"
UNIT_TESTS = RULES_DIR / "tests"
PROFILES = ("production", "demo")
CATALOG_ALERTS = [*catalog.ALERTS_GPU, *catalog.ALERTS_TRAINING, *catalog.ALERTS_NODE,
                  *catalog.ALERTS_STACK]


def rule_files(profile: str) -> list[Path]:
    return sorted((GENERATED / profile).glob("*.yml"))


def rules(profile: str) -> list[dict[str, Any]]:
    out = []
    for path in rule_files(profile):
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(group["rules"])
    return out


def alerts(profile: str) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in rules(profile) if "alert" in r}


def exprs(profile: str) -> list[str]:
    return [r["expr"] for r in rules(profile)]
