"""Load alert_rules/config.yml and resolve one profile (production defaults + overrides).

Validation happens here, before anything is generated: a typo in an override key or a
malformed duration is a clear error naming the key, never a silently ignored setting.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CONFIG_PATH = Path(__file__).with_name("config.yml")
PRODUCTION = "production"
DURATION_RE = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
DURATION_KEYS = ("for", "keep_firing_for", "window", "baseline_window", "baseline_offset",
                 "trend_window", "rate_window", "lost_window", "slow_interval",
                 "slow_alerts_min_for", "medium_interval", "medium_alerts_min_for",
                 "step_time_every", "baseline_every")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800,
                 "y": 31536000}


def seconds(duration: str) -> float:
    """A Prometheus duration (`1h30m`, `45s`) in seconds."""
    if not DURATION_RE.match(duration):
        raise ConfigError(f"{duration!r} is not a Prometheus duration like 30s or 5m")
    return sum(float(n) * _UNIT_SECONDS[unit]
               for n, unit in re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", duration))


class ConfigError(ValueError):
    """The rules configuration is invalid; the message names the offending key."""


def _merge(base: dict[str, Any], override: dict[str, Any], path: str) -> dict[str, Any]:
    """Deep-merge `override` into a copy of `base`; unknown keys or type changes are errors."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        where = f"{path}.{key}"
        if key not in base:
            raise ConfigError(f"{where}: unknown key (not in defaults)")
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: expected a mapping")
            merged[key] = _merge(base[key], value, where)
        elif isinstance(base[key], bool) or type(value) is not type(base[key]):
            if isinstance(base[key], float) and type(value) is int:
                merged[key] = float(value)
                continue
            raise ConfigError(f"{where}: expected {type(base[key]).__name__}, got {value!r}")
        else:
            merged[key] = value
    return merged


def _check_durations(tree: dict[str, Any], path: str) -> None:
    for key, value in tree.items():
        where = f"{path}.{key}"
        if isinstance(value, dict):
            _check_durations(value, where)
        elif key in DURATION_KEYS and not (isinstance(value, str) and DURATION_RE.match(value)):
            raise ConfigError(f"{where}: {value!r} is not a Prometheus duration like 30s or 5m")


@dataclass(frozen=True)
class Profile:
    """One resolved profile: what the rule builders read."""

    name: str
    values: dict[str, Any]

    def selector(self, key: str) -> str:
        try:
            return str(self.values["selectors"][key])
        except (KeyError, TypeError):
            raise ConfigError(f"selectors.{key}: missing from config") from None

    def alert(self, name: str) -> dict[str, Any]:
        try:
            return dict(self.values["alerts"][name])
        except KeyError:
            raise ConfigError(f"alerts.{name}: missing from config") from None

    @property
    def rate_window(self) -> str:
        return str(self.values["rate_window"])

    @property
    def aggregate(self) -> bool:
        """Alerts read per-job / per-node recordings (see config.yml)."""
        return bool(self.values.get("aggregate_per_job_and_node", True))

    @property
    def slow_interval(self) -> str | None:
        """The `interval` of the groups of slow-moving recordings; None (the global interval)
        without the aggregation, so the baseline is the rule set as it was."""
        return str(self.values["slow_interval"]) if self.aggregate else None

    def alert_interval(self, for_: str | None) -> str | None:
        """The `interval` of the group an alert with this `for` goes into: slow_interval when
        `for` is at least slow_alerts_min_for, else medium_interval when it is at least
        medium_alerts_min_for (the alert then fires and resolves up to that interval minus
        the global interval later, a small part of its `for`), else None (the global
        interval). Without the aggregation every alert stays at the global interval, as the
        rules were."""
        if self.slow_interval is None or not for_:
            return None
        for interval, min_for in (("slow_interval", "slow_alerts_min_for"),
                                  ("medium_interval", "medium_alerts_min_for")):
            if seconds(for_) >= seconds(str(self.values[min_for])):
                return str(self.values[interval])
        return None

    def alert_group_suffix(self, interval: str | None) -> str:
        """`-slow` for the slow_interval groups, `-medium` for the medium_interval ones."""
        if interval is None:
            return ""
        return "-slow" if interval == self.slow_interval else "-medium"

    @property
    def runbook_base_url(self) -> str:
        return str(self.values["runbook_base_url"])


def load_raw(path: Path = CONFIG_PATH) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("defaults"), dict):
        raise ConfigError(f"{path}: expected a mapping with a `defaults` mapping")
    extra = set(raw) - {"defaults", "profiles"}
    if extra:
        raise ConfigError(f"{path}: unknown top-level keys {sorted(extra)}")
    profiles = raw.get("profiles") or {}
    if not isinstance(profiles, dict) or any(
            not isinstance(body, dict | None) for body in profiles.values()):
        raise ConfigError(f"{path}: `profiles` must map profile names to mappings")
    missing = ({"selectors", "rate_window", "slow_interval", "slow_alerts_min_for",
                "medium_interval", "medium_alerts_min_for", "baseline_every",
                "runbook_base_url", "alerts"}
               - set(raw["defaults"]))
    if missing:
        raise ConfigError(f"{path}: defaults is missing {sorted(missing)}")
    return raw


def profile_names(raw: dict[str, Any]) -> list[str]:
    return [PRODUCTION, *sorted((raw.get("profiles") or {}).keys())]


def resolve(raw: dict[str, Any], name: str, over: dict[str, Any] | None = None) -> Profile:
    """The production defaults, or the defaults with profile `name` merged over them; then
    `over` (a user overlay's rule part, alert_rules/overlay.py) merged over that, checked
    the same way (known keys, same types)."""
    defaults = raw["defaults"]
    if name == PRODUCTION:
        values = copy.deepcopy(defaults)
    else:
        profiles = raw.get("profiles") or {}
        if name not in profiles:
            raise ConfigError(f"profiles.{name}: no such profile (have {sorted(profiles)})")
        values = _merge(defaults, profiles[name] or {}, f"profiles.{name}")
    if over:
        values = _merge(values, over, "overlay")
    _check_durations(values, name)
    return Profile(name=name, values=values)


def load_profiles(path: Path = CONFIG_PATH, over: dict[str, Any] | None = None
                  ) -> list[Profile]:
    raw = load_raw(path)
    return [resolve(raw, name, over) for name in profile_names(raw)]
