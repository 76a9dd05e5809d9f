"""One set of job settings: the client's defaults, the training_exporter role's defaults (and
the Slurm TaskProlog it installs) and the docs name the same socket, URL and token file.

Before: the client sent to /run/trainwatch/training.sock and the role listened on
<prefix>/run/training.sock, so a job with default settings dropped every report.
"""

from __future__ import annotations

import getpass
import grp
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ansible.runner import REPO, run_playbook
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.rank.config import MonitorConfig

PLAYBOOK = Path(__file__).with_name("job_environment.yml")


@pytest.mark.slow  # one ansible-playbook run (and the collection build, shared per process)
def test_client_role_and_docs_agree_on_the_job_environment(tmp_path: Path) -> None:
    prefix = tmp_path / "opt" / "trainwatch"
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {"gpu-node": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "ansible_become": False,
        "trainwatch_prefix": str(prefix), "trainwatch_service_user": getpass.getuser(),
        "trainwatch_service_group": grp.getgrgid(os.getgid()).gr_name,
        "trainwatch_create_service_user": False,
        "trainwatch_training_log_dir": str(prefix / "log" / "jobs")}}}}))
    run = run_playbook(PLAYBOOK, {}, tmp_path, inventory=inventory)
    assert run.rc == 0, run.describe()

    client = MonitorConfig().resolved({})
    role = json.loads((prefix / "role-defaults.json").read_text())
    assert role["socket"] == client.socket_path == catalog.DEFAULT_EXPORTER_SOCKET

    # The TaskProlog, run as slurmstepd runs it: each printed export sets the task's env.
    prolog = prefix / "etc" / "slurm-task-prolog.sh"
    printed = subprocess.run([str(prolog)], capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin"}, timeout=30).stdout
    exported = dict(line.removeprefix("export ").split("=", 1) for line in printed.splitlines())
    # the socket is all a job needs to report: its ranks poll commands on the command socket
    # beside it, which knows them by their kernel identity (no URL, no token in a job's
    # environment); its logs go to the node's training log directory, where the log scanner
    # and Filebeat read them (before: not in the environment, so a job's handler had no
    # directory unless its script named one)
    assert exported == {catalog.ENV_EXPORTER_SOCKET: client.socket_path,
                        catalog.ENV_LOG_DIR: str(prefix / "log" / "jobs")}
    # a job that chose its own socket or log directory keeps it
    own = subprocess.run([str(prolog)], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", catalog.ENV_EXPORTER_SOCKET: "/x",
                              catalog.ENV_LOG_DIR: "/y"},
                         timeout=30).stdout
    assert own == ""

    # The docs name that socket wherever they give a production socket path.
    for doc in ("deploy.md", "contracts.md", "training.md"):
        text = (REPO / "docs" / doc).read_text()
        named = set(re.findall(r"(?:^|[\s`=])(/run/\S+?\.sock)\b", text, re.MULTILINE))
        # (and the command socket beside it, derived from it)
        assert named <= {catalog.DEFAULT_EXPORTER_SOCKET,
                         catalog.command_socket(catalog.DEFAULT_EXPORTER_SOCKET)}, (doc, named)
        assert catalog.DEFAULT_EXPORTER_SOCKET in named, (doc, named)
