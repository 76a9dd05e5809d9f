"""Write dashboards/generated/*.json and the Grafana file-provisioning configs.

Usage: python -m dashboards.generate [--out DIR]
The output is committed; tests regenerate into a temporary folder and fail on drift.
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


def dashboard_json(build: Callable[[], gd.Dashboard]) -> dict[str, Any]:
    return json.loads(json.dumps(build().build(), cls=JSONEncoder))


def render_dashboards() -> dict[str, str]:
    """File name -> JSON text (sorted keys, so diffs stay small and stable)."""
    return {f"{stem}.json": json.dumps(dashboard_json(build), indent=2, sort_keys=True) + "\n"
            for stem, build in DASHBOARDS.items()}


def write(out: Path) -> list[Path]:
    return write_folder(out / "generated", render_dashboards(), "*.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE,
                        help="folder that receives generated/ and provisioning/")
    args = parser.parse_args(argv)
    for path in write(args.out):
        print(path)
    if args.out == HERE:  # the committed output: the kube-prometheus-stack ConfigMaps follow
        from dashboards import kubernetes

        print(kubernetes.write())
    return 0


if __name__ == "__main__":
    sys.exit(main())
