"""The collection deploys from what it carries (issue 38): an inventory of one's own with no
trainwatch_project_src and no trainwatch_repo_root, run from a folder that is not the
repository.

Before: the _common role needed a checkout on the controller (trainwatch_repo_root, packed with
`git archive HEAD`) or the project on the host, so this inventory failed at preflight. Here:
an inventory that names a project source it does not have stops at preflight, naming what to
set. The deploy itself from the built archive (installed with `ansible-galaxy collection
install`, the services' virtualenv built from the wheel inside it, a second run changed=0) is
tests/cluster/test_site_deploy.py, on a Slurm site of three hosts.
"""

from __future__ import annotations

import getpass
import grp
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.ansible.runner import SITE, run_playbook
from tests.support.net import free_port

SWITCHED_OFF = ("prometheus", "alertmanager", "grafana", "filebeat", "elasticsearch", "logstash",
                "kibana", "node_exporter", "gpu_exporter", "log_scanner", "remediation")


def own_inventory(path: Path, prefix: Path, port: int) -> Path:
    """A one-host inventory as a user writes it: localhost a GPU node, nothing pointing at a
    checkout."""
    host_vars = {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "ansible_pipelining": True,  # one process per task instead of a file each: less CPU
        "trainwatch_prefix": str(prefix),
        "trainwatch_service_manager": "supervisor",
        "trainwatch_service_user": getpass.getuser(),
        "trainwatch_service_group": grp.getgrgid(os.getgid()).gr_name,
        "trainwatch_create_service_user": False,
        "trainwatch_apt_update_cache": False,
        "trainwatch_generate_tokens": True,
        "trainwatch_training_log_dir": str(prefix / "log" / "jobs"),
        "trainwatch_bind_address": "127.0.0.1",
        "training_exporter_bind_address": "127.0.0.1",
        "training_exporter_port": port,
        "training_exporter_socket": str(prefix / "run" / "training.sock"),
        "trainwatch_pip_extra_args": ["--no-compile"],
        **{f"{role}_enabled": False for role in SWITCHED_OFF},
    }
    path.mkdir(parents=True)
    inventory = path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "hosts": {"localhost": host_vars},
        "children": {"gpu_nodes": {"hosts": {"localhost": None}}}}}))
    return inventory


@pytest.mark.parametrize(("settings", "named"), [
    # a copied tree, not a checkout: before, `git archive` failed with "not a git repository"
    ({"trainwatch_repo_root": "{copy}"}, ["trainwatch_repo_root", "{copy}",
                                          "trainwatch_project_source: wheel"]),
    ({"trainwatch_project_source": "path"}, ["trainwatch_project_src"]),
], ids=["repo-root-not-a-checkout", "path-without-project-src"])
def test_a_missing_project_source_stops_at_preflight_naming_what_to_set(
        tmp_path: Path, settings: dict[str, str], named: list[str],
        ansible_collection: Path) -> None:
    copy = tmp_path / "trainwatch-copy"
    copy.mkdir()
    prefix = tmp_path / "prefix"
    inventory = own_inventory(tmp_path / "inventory", prefix, free_port())
    hosts = yaml.safe_load(inventory.read_text())
    hosts["all"]["hosts"]["localhost"].update(
        {k: v.format(copy=copy) for k, v in settings.items()})
    inventory.write_text(yaml.safe_dump(hosts))
    run = run_playbook(SITE, {}, tmp_path, inventory=inventory, cwd=tmp_path)
    assert run.rc != 0 and run.total("failed") == 1, run.describe()
    failure = run.output[run.output.index("FAILED!"):]
    for name in named:
        assert name.format(copy=copy) in failure, run.describe()
    assert not (prefix / "venv").exists()
