"""Numbers that cross a boundary must be finite: strict JSON parsing and a finiteness check.

Python's json module accepts the non-standard literals `NaN`, `Infinity` and `-Infinity`
(and numbers too large for a float become inf), and a JSON-schema bound does not reject NaN:
every comparison with NaN is false, so `"exclusiveMinimum": 0, "maximum": 1` lets it through.
A `scale_lr` with factor NaN was accepted that way, applied by every rank, and made the
learning rate and then the loss NaN. So every place that takes numbers from outside (the
training exporter's control API, the client that fetches commands, the remediation webhook,
playbook and config files) parses with `loads` and checks with `require_finite`, and the
schemas' bounds then hold.
"""

from __future__ import annotations

import json
import math
from typing import Any


class NonFiniteError(ValueError):
    """A NaN or infinite number where only finite ones are allowed; says where."""


def _reject_constant(name: str) -> Any:
    raise NonFiniteError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # e.g. 1e400 overflows to inf
        raise NonFiniteError(f"number {text[:40]} is out of range")
    return value


def loads(data: str | bytes | bytearray) -> Any:
    """json.loads that refuses NaN/Infinity literals and numbers that overflow a float
    (NonFiniteError, a ValueError like every other JSON error)."""
    return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)


def _any_non_finite(value: Any) -> bool:
    """Whether any float inside `value` is NaN or infinite: one pass over the document with no
    path bookkeeping (the webhook runs this on every payload)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if kind is dict:
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif isinstance(item, float) and item - item != 0.0:  # inf - inf and nan are NaN
            return True
    return False


def first_non_finite(value: Any, where: str = "") -> str | None:
    """The path ("args/factor") of the first NaN or infinite float inside `value`, or None."""
    if not _any_non_finite(value):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (where or "<value>")
    if isinstance(value, dict):
        for key, item in value.items():
            found = first_non_finite(item, f"{where}/{key}" if where else str(key))
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = first_non_finite(item, f"{where}/{index}" if where else str(index))
            if found:
                return found
    return None


def require_finite(value: Any, what: str) -> None:
    """Raise NonFiniteError naming the first non-finite number inside `value`."""
    where = first_non_finite(value)
    if where is not None:
        raise NonFiniteError(f"{what}: {where}: must be a finite number")
