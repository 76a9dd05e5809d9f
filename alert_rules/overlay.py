"""The user overlay: one YAML file kept outside the repository, merged over the shipped
defaults of everything the generators write, so that nobody forks Trainwatch to customise it.

    python -m alert_rules.overlay ~/trainwatch/overlay.yml    # check it
    python -m scripts.build --overlay ~/trainwatch/overlay.yml --out ~/trainwatch/build

Every key is optional (docs/adopt.md has an example):

    runbook_base_url: https://wiki.example.org/trainwatch/runbooks  # absolute http(s) URL
    selectors:            # merged over alert_rules/config.yml's `selectors` in every profile
      gpu: 'job="nvidia-dcgm-exporter"'
    kubernetes:
      namespace: monitoring            # of every object
      release: kube-prometheus-stack   # the label the chart's Prometheus selects rules by
      name_prefix: trainwatch          # metadata.name of every object starts with it
      dashboard_label: {grafana_dashboard: "1"}  # what the chart's Grafana sidecar watches
    receivers:            # Alertmanager receiver bodies by route (paging, infra, ml, deadman)
      deadman: {webhook_configs: [{url: https://heartbeat.example.org/ping}]}

The overlay is checked whole before anything is written (unknown keys, a relative runbook
URL or a name Kubernetes would refuse are errors naming the key), and the build refuses to
write an overlay's output into the repository: the committed files stay the defaults.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from alert_rules.config import ConfigError

ENV = "TRAINWATCH_OVERLAY"
# Alertmanager's routes (alert_rules/alertmanager.yml.j2): the receivers an overlay can fill
RECEIVERS = ("paging", "infra", "ml", "deadman")
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# a Kubernetes label key (optional DNS-subdomain prefix, then a name) and value
_LABEL_KEY = (r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?"
              r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "runbook_base_url": {"type": "string", "pattern": r"^https?://[^\s#]+$"},
        "selectors": {"type": "object", "additionalProperties": {"type": "string"}},
        "kubernetes": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "namespace": {"type": "string", "pattern": _DNS_LABEL},
                "release": {"type": "string", "pattern": _DNS_LABEL},
                # room for the longest suffix the generators add (-dashboard-remediation-alerts)
                "name_prefix": {"type": "string",
                                "pattern": r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$"},
                "dashboard_label": {
                    "type": "object", "minProperties": 1, "maxProperties": 1,
                    "propertyNames": {"pattern": _LABEL_KEY},
                    "additionalProperties": {"type": "string", "pattern": _LABEL_VALUE},
                },
            },
        },
        "receivers": {
            "type": "object",
            "additionalProperties": False,
            "properties": {name: {"type": "object"} for name in RECEIVERS},
        },
    },
}


@dataclass(frozen=True)
class Kubernetes:
    """Where and under which names the Kubernetes objects go (defaults: kube-prometheus-stack's
    own, as its chart installs them)."""

    namespace: str = "monitoring"
    release: str = "kube-prometheus-stack"
    name_prefix: str = "trainwatch"
    dashboard_label: dict[str, str] = field(default_factory=lambda: {"grafana_dashboard": "1"})


@dataclass(frozen=True)
class Overlay:
    """A validated overlay; `Overlay()` is the shipped defaults (no overlay file)."""

    source: Path | None = None
    runbook_base_url: str | None = None
    selectors: dict[str, str] = field(default_factory=dict)
    kubernetes: Kubernetes = field(default_factory=Kubernetes)
    receivers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def rule_values(self) -> dict[str, Any]:
        """The part merged over each profile of alert_rules/config.yml."""
        out: dict[str, Any] = {}
        if self.runbook_base_url:
            out["runbook_base_url"] = self.runbook_base_url
        if self.selectors:
            out["selectors"] = dict(self.selectors)
        return out


def parse(doc: Any, source: Path | None = None) -> Overlay:
    """Validate an overlay document; ConfigError names the offending key."""
    if doc is None:
        doc = {}
    try:
        jsonschema.Draft7Validator(SCHEMA).validate(doc)
    except jsonschema.ValidationError as exc:
        where = ".".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise ConfigError(f"{source or 'overlay'}: {where}: {exc.message}") from None
    k8s = {**doc.get("kubernetes", {})}
    return Overlay(source=source, runbook_base_url=doc.get("runbook_base_url"),
                   selectors=dict(doc.get("selectors", {})),
                   kubernetes=Kubernetes(**k8s),
                   receivers=copy.deepcopy(doc.get("receivers", {})))


def load(path: Path | None) -> Overlay:
    """The overlay at `path`, else at $TRAINWATCH_OVERLAY, else the defaults."""
    if path is None and os.environ.get(ENV):
        path = Path(os.environ[ENV])
    if path is None:
        return Overlay()
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the overlay: {exc}") from exc
    return parse(doc, path)


def ansible_vars(overlay: Overlay) -> dict[str, Any]:
    """The overlay's receivers as the alertmanager role's variable (alert_rules/
    alertmanager.yml.j2 renders them), for `ansible-playbook -e @FILE` (scripts/build.py
    writes them): routes keep their receivers, only the bodies come from the overlay."""
    return {"alertmanager_receiver_configs": {
        name: copy.deepcopy(overlay.receivers.get(name, {})) for name in RECEIVERS}}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        description="Check a user overlay (python -m scripts.build --overlay FILE --out DIR "
                    "builds from it).")
    parser.add_argument("overlay", type=Path, nargs="?", default=None,
                        help=f"the overlay file (default ${ENV})")
    args = parser.parse_args(argv)
    try:
        overlay = load(args.overlay)
    except ConfigError as exc:
        print(f"alert_rules.overlay: {exc}", file=sys.stderr)
        return 2
    print(f"{overlay.source or 'no overlay'}: ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
