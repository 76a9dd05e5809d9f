"""The Alertmanager configuration as the alertmanager role writes it, for tests.

Ansible is the only renderer of alert_rules/alertmanager.yml.j2: each set of variables becomes
one host of a scratch inventory, and one ansible-playbook run renders them all with the role in
render-only mode (argument specs, preflight asserts, amtool check-config), each under its own
prefix. A set the role refuses fails its host, and that host's message is returned.
"""

from __future__ import annotations

import getpass
import grp
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.ansible.runner import PlaybookRun, run_playbook

PLAYBOOK = Path(__file__).resolve().parents[1] / "ansible" / "render_alertmanager.yml"


class RenderError(Exception):
    """The role refused a set of variables (or Ansible failed): the run's output."""


def _run(variants: Mapping[str, Mapping[str, Any]], workdir: Path) -> PlaybookRun:
    workdir.mkdir(parents=True, exist_ok=True)
    hosts = {}
    for name, overrides in variants.items():
        prefix = workdir / name
        hosts[name] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "trainwatch_prefix": str(prefix),
            # amtool's config defaults to a system path; a render stays inside its prefix
            "alertmanager_amtool_config_file": str(prefix / "etc" / "amtool.yml"),
            **overrides,
        }
    inventory = workdir / "alertmanager-inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    common = {"ansible_become": False, "trainwatch_generate_tokens": True,
              "trainwatch_service_user": getpass.getuser(),
              "trainwatch_service_group": grp.getgrgid(os.getgid()).gr_name}
    return run_playbook(PLAYBOOK, common, workdir, inventory=inventory)


def render_alertmanager(variants: Mapping[str, Mapping[str, Any]], workdir: Path
                        ) -> dict[str, Path]:
    """Variant name -> its rendered alertmanager.yml; RenderError if any variant failed."""
    run = _run(variants, workdir)
    if run.rc != 0 or run.total("failed"):
        raise RenderError(run.describe())
    return {name: workdir / name / "etc" / "alertmanager" / "alertmanager.yml"
            for name in variants}


def refused_variants(variants: Mapping[str, Mapping[str, Any]], workdir: Path
                     ) -> tuple[set[str], str]:
    """The variants the role refused (their host failed), and the run's output."""
    run = _run(variants, workdir)
    return {host for host, counts in run.recap.items() if counts.get("failed")}, run.output


def render_one(overrides: Mapping[str, Any], workdir: Path) -> Path:
    """One configuration, e.g. a test stack's (webhook URL and token file on free ports)."""
    return render_alertmanager({"alertmanager": overrides}, workdir)["alertmanager"]
