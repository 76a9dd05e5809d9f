"""Label values are attacker-influenced text: only an allowlisted shape may be used anywhere.

A value that reaches a URL, an Ansible --limit or extra var, or a process lookup must match
SAFE_VALUE: letters, digits and `._:-`, not starting with `-` or `.` (so no option injection,
no `..`, no `/`, no shell metacharacters, no whitespace).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

SAFE_VALUE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:-]{0,127}$")


class LabelError(ValueError):
    """A required label is missing or its value is not allowed; the message is the audit reason."""


def safe_labels(labels: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The named labels, each present and allowlisted, else LabelError (fail closed)."""
    out: dict[str, str] = {}
    for name in names:
        value = labels.get(name)
        if value is None or value == "":
            raise LabelError(f"missing target label {name!r}")
        if not SAFE_VALUE.match(value):
            raise LabelError(f"label {name!r} has a value outside the allowlist")
        out[name] = value
    return out
