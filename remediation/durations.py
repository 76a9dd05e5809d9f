"""Durations as written in configs and playbooks ("30s", "5m", 90) -> seconds."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PATTERN = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)", re.ASCII)


def seconds(value: float | int | str) -> float:
    """Parse a duration; the JSON schemas already restrict the shape, this converts it."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = _PATTERN.fullmatch(str(value))  # never "5m\n"
    if not match:
        raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h)")
    return float(match.group(1)) * _UNITS[match.group(2)]
