"""Write dashboards/generated/*.json (the provisioning configs are the grafana role's).

Usage: python -m dashboards.generate [--out DIR] [--overlay FILE --out DIR]
The output is committed; tests regenerate into a temporary folder and fail on drift. With a
user overlay (alert_rules/overlay.py) the ConfigMaps follow into DIR/generated/kubernetes/,
never over the committed defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from alert_rules import overlay as overlays
from alert_rules.generated_files import write_folder
from dashboards import (
    goodput,
    gpu_fleet,
    gpu_node,
    remediation_alerts,
    stack_health,
    training_job,
)

HERE = Path(__file__).parent
# file stem -> builder; the stem is also the dashboard's uid suffix
DASHBOARDS: dict[str, Callable[[], gd.Dashboard]] = {
    "gpu-fleet": gpu_fleet.build,
    "gpu-node": gpu_node.build,
    "training-job": training_job.build,
    "goodput": goodput.build,
    "remediation-alerts": remediation_alerts.build,
    "stack-health": stack_health.build,
}
# Where the provisioned files live on the Grafana host (the Grafana role copies them there).
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


def write(out: Path) -> list[Path]:
    return write_folder(out / "generated", render_dashboards(), "*.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE,
                        help="folder that receives generated/")
    parser.add_argument("--overlay", type=Path, default=None,
                        help=f"user overlay (alert_rules/overlay.py; default ${overlays.ENV})")
    args = parser.parse_args(argv)
    from dashboards import kubernetes

    try:
        overlay = overlays.load(args.overlay)
        overlays.refuse_tracked_output(overlay, args.out, HERE)
        # the committed output, or an overlay's: the kube-prometheus-stack ConfigMaps follow
        maps = (kubernetes.render(overlay=overlay)
                if args.out == HERE or overlay.source else None)
    except ValueError as exc:
        print(f"dashboards.generate: {exc}", file=sys.stderr)
        return 2
    for path in write(args.out):
        print(path)
    if maps is not None:
        target = args.out / "generated" / "kubernetes" / kubernetes.OUT_FILE.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(maps)
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
