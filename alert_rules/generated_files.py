"""How the generators write YAML: shared by the rules, their PrometheusRule objects and the
dashboards' ConfigMaps (scripts/build.py writes the files)."""

from __future__ import annotations

import yaml


class Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, dashboard JSON) as literal blocks, so generated files stay
    readable and their diffs small."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


Dumper.add_representer(str, _str)
