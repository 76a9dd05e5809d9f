"""Render the compose stack's config files from the Ansible roles' own templates.

One source of truth: the Prometheus, Alertmanager, Grafana, Elasticsearch, Logstash and Kibana
files that compose mounts are rendered from the same Jinja templates the Ansible roles use,
with the plain role defaults plus compose/vars.yml, into compose/rendered/ (gitignored).

    python compose/render.py --gpu-nodes gpu-01.example.internal,gpu-02.example.internal

Exits non-zero with a one-line reason on a bad host name or a variable that would need an
inventory (a role default that is itself a template and that vars.yml does not override).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import jinja2
import yaml
from ansible.module_utils.parsing.convert_bool import boolean

REPO = Path(__file__).resolve().parents[1]
ROLES = REPO / "ansible" / "roles"
COMPOSE = REPO / "compose"
HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(:[0-9]{1,5})?$")
DEFAULT_PORTS = {"gpu_exporter_port": 9445, "training_exporter_port": 9446,
                 "log_scanner_port": 9447, "node_exporter_port": 9100}

# rendered file -> template (relative to the repo)
TEMPLATES = {
    "prometheus/prometheus.yml": "ansible/roles/prometheus/templates/prometheus.yml.j2",
    "alertmanager/alertmanager.yml": "alert_rules/alertmanager.yml.j2",
    "grafana/provisioning/datasources/trainwatch.yml":
        "ansible/roles/grafana/templates/datasources.yml.j2",
    "grafana/provisioning/dashboards/trainwatch.yml":
        "ansible/roles/grafana/templates/dashboards.yml.j2",
    "elasticsearch/ilm-policy.json": "ansible/roles/elasticsearch/templates/ilm-policy.json.j2",
    "elasticsearch/index-template.json":
        "ansible/roles/elasticsearch/templates/index-template.json.j2",
    "elasticsearch/logstash-writer-role.json":
        "ansible/roles/elasticsearch/templates/logstash-writer-role.json.j2",
    "logstash/pipeline/trainwatch.conf": "ansible/roles/logstash/templates/trainwatch.conf.j2",
    "kibana/saved-objects.ndjson": "ansible/roles/kibana/templates/saved-objects.ndjson.j2",
}


class RenderError(Exception):
    """A variable or argument that cannot be rendered for compose."""


def _to_nice_yaml(value: Any, indent: int = 2, **_: Any) -> str:
    return yaml.safe_dump(value, indent=indent, default_flow_style=False, sort_keys=False)


def plain_defaults() -> dict[str, Any]:
    """Role defaults and vars that need no inventory (values without a Jinja expression)."""
    values: dict[str, Any] = {}
    files = sorted(ROLES.glob("*/defaults/main.yml")) + sorted(ROLES.glob("*/vars/main.yml"))
    files.append(REPO / "alert_rules" / "alertmanager_defaults.yml")
    for path in files:
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            if "{{" not in json.dumps(value):
                values[name] = value
    return values


def inventory(gpu_nodes: list[str]) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """Compose service names stand in for the monitoring hosts; GPU nodes are outside compose."""
    groups = {"compose_prometheus": ["prometheus"], "compose_alertmanager": ["alertmanager"],
              "compose_remediation": ["remediation"], "gpu_nodes": gpu_nodes}
    hostvars: dict[str, dict[str, Any]] = {}
    for host in [*gpu_nodes, "prometheus", "alertmanager", "remediation"]:
        name, _, port = host.partition(":")
        hostvars[host] = {"trainwatch_scrape_address": name,
                          "inventory_hostname_short": name.split(".")[0]}
        if port:
            raise RenderError(f"give GPU nodes without a port: {host!r}")
    return groups, hostvars


def environment() -> jinja2.Environment:
    # YAML/JSON/Logstash configs, not HTML: autoescape would corrupt them.
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,  # noqa: S701
                             trim_blocks=True, loader=jinja2.FileSystemLoader(str(REPO)))
    env.filters["to_json"] = lambda value, **_: json.dumps(value)
    env.filters["to_nice_yaml"] = _to_nice_yaml
    env.filters["bool"] = lambda value: boolean(value, strict=False)  # Ansible's own parsing
    return env


MARKER = ".rendered-by-compose-render"


def render(out_dir: Path, gpu_nodes: list[str], rules_profile: str) -> list[Path]:
    """Render into a temporary folder beside `out_dir`, then swap it in: a failed render
    leaves the previous output untouched, and a folder that is not an earlier render (say
    `--out ~`) is refused rather than deleted."""
    if out_dir.exists() and not (out_dir / MARKER).is_file():
        raise RenderError(f"{out_dir} exists and is not an earlier render: choose another --out")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        written = _render_into(staging, gpu_nodes, rules_profile)
        (staging / MARKER).write_text("")
        staging.chmod(0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [out_dir / path.relative_to(staging) for path in written]


def _render_into(out_dir: Path, gpu_nodes: list[str], rules_profile: str) -> list[Path]:
    for host in gpu_nodes:
        if not HOSTNAME.match(host):
            raise RenderError(f"not a host name: {host!r}")
    variables = plain_defaults()
    variables.update(yaml.safe_load((COMPOSE / "vars.yml").read_text()))
    groups, hostvars = inventory(gpu_nodes)
    variables.update(groups=groups, hostvars=hostvars)
    env = environment()
    written = []
    for target, template in TEMPLATES.items():
        try:
            text = env.get_template(template).render(**variables)
        except jinja2.UndefinedError as exc:
            raise RenderError(f"{template}: {exc.message} (add it to compose/vars.yml)") from exc
        path = out_dir / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    remediation = out_dir / "remediation" / "remediation.yml"
    remediation.parent.mkdir(parents=True, exist_ok=True)
    remediation.write_text(yaml.safe_dump(variables["remediation_config"], sort_keys=True))
    written.append(remediation)
    # The only hosts host actions may target, named as alerts name them (their short name).
    nodes = {hostvars[h]["inventory_hostname_short"]: {"ansible_host": h} for h in gpu_nodes}
    if len(nodes) != len(gpu_nodes):
        raise RenderError("GPU nodes must have distinct short names (the alerts' node label)")
    host_inventory = out_dir / "remediation" / "inventory.yml"
    host_inventory.write_text(yaml.safe_dump({"all": {"hosts": nodes}}, sort_keys=True))
    written.append(host_inventory)
    rules_src = REPO / "alert_rules" / "generated" / rules_profile
    rule_files = sorted(rules_src.glob("*.yml"))
    if not rule_files:
        raise RenderError(f"no rule files in {rules_src}: run python -m alert_rules.generate")
    (out_dir / "prometheus" / "rules").mkdir(parents=True)
    for rule_file in rule_files:
        copied = shutil.copy(rule_file, out_dir / "prometheus" / "rules" / rule_file.name)
        written.append(Path(copied))
    for path in written:
        path.chmod(0o644)  # read by the containers' own users; no secret is in these files
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu-nodes", default="",
                        help="comma-separated GPU node host names (their exporters are scraped)")
    parser.add_argument("--rules-profile", default="production", choices=["production", "demo"])
    parser.add_argument("--out", type=Path, default=COMPOSE / "rendered")
    args = parser.parse_args(argv)
    nodes = [n.strip() for n in args.gpu_nodes.split(",") if n.strip()]
    try:
        written = render(args.out, nodes, args.rules_profile)
    except RenderError as exc:
        print(f"render.py: {exc}", file=sys.stderr)
        return 2
    print(f"rendered {len(written)} files into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
