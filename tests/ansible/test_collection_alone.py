"""The collection deploys from what it carries (issue 38): the built archive, installed with
`ansible-galaxy collection install` as a user installs it, and an inventory of one's own with no
trainwatch_project_src and no trainwatch_repo_root, run from a folder that is not the
repository. The services' virtualenv is built from the wheel inside the collection.

Before: the _common role needed a checkout on the controller (trainwatch_repo_root, packed with
`git archive HEAD`) or the project on the host, so this inventory failed at preflight.

One Python service (the training exporter) is kept, every other component switched off: the
venv and the pip install of the stack extra are the cost (about 30 s of CPU), not the rest.
pip's extra arguments (trainwatch_pip_extra_args) are --no-compile, which saves compiling every
dependency and shows that they reach pip.
"""

from __future__ import annotations

import getpass
import grp
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.ansible.runner import (
    REPO,
    SITE,
    STOP,
    VENV_BIN,
    PlaybookRun,
    ansible_env,
    built_collection,
    run_playbook,
)
from tests.ansible.test_local_deploy import processes_under
from tests.support.net import free_port, wait_until

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


def installed_record(venv: Path) -> dict:
    """The direct_url.json pip wrote for the project (PEP 610): where it was installed from."""
    found = sorted(venv.glob(
        "lib/python*/site-packages/trainwatch_gpu-*.dist-info/direct_url.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


@pytest.mark.slow  # a virtualenv with the stack extra, and two converges
def test_the_installed_collection_deploys_from_its_own_wheel(tmp_path: Path) -> None:
    # The archive as a user downloads it, far from the repository.
    download = tmp_path / "download"
    download.mkdir()
    archive = Path(shutil.copy2(built_collection(), download))
    collections = tmp_path / "collections"
    env = ansible_env(collections)
    env.pop("PYTHONPATH", None)  # nothing of a checkout on the controller's or services' path
    subprocess.run([str(VENV_BIN / "ansible-galaxy"), "collection", "install", "--offline",
                    "-p", str(collections), str(archive)], cwd=tmp_path, env=env, check=True,
                   capture_output=True, text=True, timeout=300)
    carried = sorted(collections.glob(
        "ansible_collections/trainwatch/stack/roles/_common/files/wheels/*.whl"))
    assert len(carried) == 1, carried

    prefix = tmp_path / "prefix"
    port = free_port()
    inventory = own_inventory(tmp_path / "inventory", prefix, port)
    assert REPO not in tmp_path.parents and not (tmp_path / ".git").exists()

    def deploy(playbook: str) -> PlaybookRun:
        return run_playbook(playbook, {}, tmp_path, inventory=inventory, env=env, cwd=tmp_path)

    try:
        first = deploy(SITE)
        assert first.rc == 0 and first.total("failed") == 0, first.describe()

        venv = prefix / "venv"
        # The wheel the collection carries, on the host byte for byte, installed as an archive
        # (not an editable folder of a checkout).
        host_wheel = prefix / "wheels" / carried[0].name
        assert host_wheel.read_bytes() == carried[0].read_bytes()
        record = installed_record(venv)
        assert record["url"] == host_wheel.as_uri() and "archive_info" in record, record
        imported = subprocess.run(
            [str(venv / "bin" / "python"), "-c",
             "import trainwatch.exporters as m; print(m.__file__)"],
            capture_output=True, text=True, check=True, timeout=60, cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin"}).stdout.strip()
        assert Path(imported).is_relative_to(venv), imported
        # trainwatch_pip_extra_args reached pip: nothing the exporter never imports is compiled
        site = Path(imported).parents[2]
        assert (site / "ansible_runner").is_dir()
        assert not list((site / "ansible_runner").rglob("*.pyc"))
        # The service runs the virtualenv's console script, and answers.
        running = processes_under(prefix)
        assert any(str(venv / "bin" / "training-exporter") in p for p in running), running
        body = wait_until(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read(),
            timeout=60, what=f"the training exporter on port {port}")
        assert b"trainwatch_" in body

        second = deploy(SITE)
        assert second.rc == 0 and second.total("changed") == 0, second.describe()
    finally:
        stop = deploy(STOP)
        try:
            wait_until(lambda: not processes_under(prefix), timeout=60,
                       what="every process of the deployment to exit")
        except TimeoutError:
            pytest.fail(f"stop.yml rc={stop.rc} left {processes_under(prefix)}")
    assert stop.rc == 0, stop.describe()


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
