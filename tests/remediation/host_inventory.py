"""A local Ansible inventory of several hosts whose plays leave per-host marker files.

Every host uses `ansible_connection: local`, so a play "on" node-b really runs here; the
playbook writes `<markers>/<inventory_hostname>` and a JSON dump of the module's environment,
so a test can see on which hosts a play ran and what the Ansible children inherited.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HOSTS = ("node-a", "node-b", "node-c", "gpu-x")
# `gpu-x` is both a host and a group (Ansible warns, and allows it): a name that is ambiguous
# as a limit. `gpu` is a plain group.
GROUPS = {"gpu": ["node-a", "node-b"], "gpu-x": ["node-c"]}

MARK_PLAYBOOK = """\
---
- name: Mark the host this play ran on
  hosts: all
  gather_facts: false
  tasks:
    - name: Write the marker and the environment the module got
      ansible.builtin.command:
        argv:
          - "{{ ansible_python_interpreter }}"
          - -c
          - "import json, os, sys; open(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))"
          - "{{ marker_dir }}/{{ inventory_hostname }}"
      changed_when: true
"""


def write_inventory(path: Path, markers: Path, extra_host_vars: dict[str, Any] | None = None
                    ) -> Path:
    markers.mkdir(parents=True, exist_ok=True)
    host_vars = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "marker_dir": str(markers), **(extra_host_vars or {})}
    doc = {"all": {"hosts": {h: dict(host_vars) for h in HOSTS},
                   "children": {g: {"hosts": {h: {} for h in members}}
                                for g, members in GROUPS.items()}}}
    path.write_text(yaml.safe_dump(doc))
    return path


def write_mark_playbook(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "mark.yml"
    path.write_text(MARK_PLAYBOOK)
    return path


def marked(markers: Path) -> set[str]:
    return {p.name for p in markers.iterdir()} if markers.is_dir() else set()


REMEDIATION_PLAYBOOK = {
    "name": "host_mark",
    "match": {"alertname": ["HostMark"]},
    "target": ["node"],
    "cooldown": "1h",
    "steps": [{"action": "ansible", "playbook": "mark.yml"}],
}
