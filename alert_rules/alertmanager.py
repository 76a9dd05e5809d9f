"""Render alert_rules/alertmanager.yml.j2 outside Ansible (compose's render step, tests).

The template uses plain Jinja2 plus Ansible's `to_json` filter, implemented here the way
Ansible does (json.dumps with default arguments), with Ansible's template defaults
(trim_blocks on), so both renderers produce the same file.

Usage: python -m alert_rules.alertmanager [--vars overrides.yml] [--out alertmanager.yml]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import jinja2
import yaml

TEMPLATE = Path(__file__).with_name("alertmanager.yml.j2")
DEFAULTS = Path(__file__).with_name("alertmanager_defaults.yml")
RECEIVERS = ("paging", "infra", "ml")


def defaults() -> dict[str, Any]:
    return dict(yaml.safe_load(DEFAULTS.read_text()))


def _validate(variables: dict[str, Any]) -> None:
    unknown = set(variables) - set(defaults())
    if unknown:
        raise ValueError(f"unknown Alertmanager template variables: {sorted(unknown)}")
    if not isinstance(variables["alertmanager_remediation_enabled"], bool):
        raise ValueError("alertmanager_remediation_enabled must be true or false")
    configs = variables["alertmanager_receiver_configs"]
    if not isinstance(configs, dict) or set(configs) - set(RECEIVERS):
        raise ValueError(f"alertmanager_receiver_configs: a mapping with keys {RECEIVERS}")
    for name, body in configs.items():
        if body is not None and not isinstance(body, dict):
            raise ValueError(f"alertmanager_receiver_configs.{name}: a mapping, got {body!r}")


def render(overrides: dict[str, Any] | None = None) -> str:
    """The Alertmanager config for the defaults with `overrides` applied."""
    variables = {**defaults(), **(overrides or {})}
    _validate(variables)
    env = jinja2.Environment(  # noqa: S701 - renders YAML, not HTML
        loader=jinja2.FileSystemLoader(str(TEMPLATE.parent)),
        undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    return env.get_template(TEMPLATE.name).render(**variables)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vars", type=Path, help="YAML file with variable overrides")
    parser.add_argument("--out", type=Path, help="write here (mode 0640) instead of stdout")
    args = parser.parse_args(argv)
    try:
        overrides = yaml.safe_load(args.vars.read_text()) if args.vars else {}
        if overrides is not None and not isinstance(overrides, dict):
            raise ValueError(f"{args.vars}: expected a mapping of alertmanager_* variables")
        text = render(overrides or {})
    except (OSError, ValueError, yaml.YAMLError, jinja2.TemplateError) as exc:
        print(f"alert_rules.alertmanager: {exc}", file=sys.stderr)
        return 2
    if args.out:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        os.fchmod(fd, 0o640)  # an existing file keeps its old mode; receivers hold secrets
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
