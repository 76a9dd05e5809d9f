"""The dashboards as Grafana JSON (dashboards/generated/<stem>.json; the provisioning configs
are the grafana role's).

`python -m scripts.build` writes them (and everything else generated); the tests compare the
committed files with `render_dashboards` byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from dashboards import (
    goodput,
    gpu_fleet,
    gpu_node,
    remediation_alerts,
    stack_health,
    training_job,
)

# file stem -> builder; the stem is also the dashboard's uid suffix
DASHBOARDS: dict[str, Callable[[], gd.Dashboard]] = {
    "gpu-fleet": gpu_fleet.build,
    "gpu-node": gpu_node.build,
    "training-job": training_job.build,
    "goodput": goodput.build,
    "remediation-alerts": remediation_alerts.build,
    "stack-health": stack_health.build,
}
# The uid of the Prometheus data source the grafana role provisions
# (ansible/roles/grafana/templates/datasources.yml.j2).
DATASOURCE_UID = "trainwatch-prometheus"


# Fields the SDK writes that Grafana's own dashboard schema (@grafana/schema) does not know:
# the interval variable's auto settings on every variable, a zero UUID as every variable's
# `id`, and the long-removed `style`.
# tests/dashboards/test_grafana_schema.py type-checks the output against that schema.
_INTERVAL_ONLY = ("auto", "auto_count", "auto_min")
_NOT_IN_SCHEMA = ("style",)
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def without_sdk_leftovers(doc: dict[str, Any]) -> dict[str, Any]:
    """The SDK's JSON less what Grafana's schema does not define (and a zero dashboard `id`,
    which only a dashboard saved in Grafana's database has)."""
    for key in _NOT_IN_SCHEMA:
        doc.pop(key, None)
    if doc.get("id") == 0:
        doc.pop("id")
    for variable in doc.get("templating", {}).get("list", []):
        if variable.get("id") == _ZERO_UUID:
            variable.pop("id")
        if variable.get("type") != "interval":
            for key in _INTERVAL_ONLY:
                variable.pop(key, None)
    return doc


def dashboard_json(build: Callable[[], gd.Dashboard]) -> dict[str, Any]:
    return without_sdk_leftovers(json.loads(json.dumps(build().build(), cls=JSONEncoder)))


def render_dashboards() -> dict[str, str]:
    """File name -> JSON text (sorted keys, so diffs stay small and stable)."""
    return {f"{stem}.json": json.dumps(dashboard_json(build), indent=2, sort_keys=True) + "\n"
            for stem, build in DASHBOARDS.items()}
