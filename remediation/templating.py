"""`${labels.NAME}` / `${config.NAME}` placeholders in playbook step parameters.

Only allowlisted label values (trainwatch.remediation.labels) are ever substituted, and the result
is
data (a JSON value, a URL path segment after quoting, an Ansible extra var), never a shell line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

PLACEHOLDER = re.compile(r"\$\{(labels|config)\.([A-Za-z_][A-Za-z0-9_]*)\}")
CONFIG_KEYS = frozenset({"pager_url", "alertmanager_url", "prometheus_url"})


class TemplateError(ValueError):
    """A placeholder that cannot be filled (unknown config key, missing label)."""


def referenced_labels(steps: Iterable[Any]) -> set[str]:
    """Label names used by placeholders anywhere inside `steps`."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.update(n for kind, n in PLACEHOLDER.findall(value) if kind == "labels")
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for step in steps:
        walk(step)
    return found


def render(value: Any, labels: Mapping[str, str], config: Mapping[str, str | None],
           *, url: bool = False) -> Any:
    """Fill placeholders recursively. With url=True label values are percent-quoted."""
    if isinstance(value, dict):
        return {k: render(v, labels, config, url=url) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, labels, config, url=url) for v in value]
    if not isinstance(value, str):
        return value

    def fill(match: re.Match[str]) -> str:
        kind, name = match.groups()
        if kind == "labels":
            if name not in labels:
                raise TemplateError(f"label {name!r} is not available")
            return quote(labels[name], safe="") if url else labels[name]
        if name not in CONFIG_KEYS or not config.get(name):
            raise TemplateError(f"config key {name!r} is not set")
        return str(config[name])

    return PLACEHOLDER.sub(fill, value)
