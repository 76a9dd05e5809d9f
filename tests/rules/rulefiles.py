"""Paths and parsed contents of the generated rule files, shared by the rule tests."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from alert_rules.config import load_raw

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "alert_rules"
GENERATED = RULES_DIR / "generated"
UNIT_TESTS = RULES_DIR / "tests"
PROFILES = ("production", "demo", "dcgm")
# The alert names: the keys of `alerts` in alert_rules/config.yml, the one list of them.
CONFIG_ALERTS = sorted(load_raw()["defaults"]["alerts"])


DCGM_COUNTERS_CSV = Path(__file__).parent / "fixtures" / "dcgm-exporter-default-counters.csv"
_DCGM_FIELD = re.compile(r"^(#\s*)?(DCGM_\w+)\s*,", re.MULTILINE)


def dcgm_counters_file() -> tuple[set[str], set[str]]:
    """(enabled, commented-out) field names of dcgm-exporter's default counters file."""
    enabled, commented = set(), set()
    for hash_mark, name in _DCGM_FIELD.findall(DCGM_COUNTERS_CSV.read_text()):
        (commented if hash_mark else enabled).add(name)
    return enabled, commented


def dcgm_field_names() -> set[str]:
    """Every dcgm-exporter field the dcgm source may read: the defaults file (enabled or not)
    plus the DCGM fields it maps that the file does not list (alert_rules/gpu_source.py)."""
    from alert_rules import gpu_source

    enabled, commented = dcgm_counters_file()
    return enabled | commented | set(gpu_source.NOT_IN_COUNTERS_FILE)


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


def alerts_of(profile: str, component: str) -> list[str]:
    """The profile's alert names whose `component` label is `component` (gpu, training, ...)."""
    return sorted(name for name, rule in alerts(profile).items()
                  if rule.get("labels", {}).get("component") == component)
