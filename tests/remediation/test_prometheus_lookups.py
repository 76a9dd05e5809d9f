"""The Prometheus look-ups the actions share (remediation/actions/prometheus.py): an error
names the action whose step failed. Before issue 27 the ansible action borrowed the
training_command action's look-up, and its failures read "training_command: ..."."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from tests.remediation.helpers import stub_server
from trainwatch.remediation.actions import ansible, training_command
from trainwatch.remediation.actions.base import ActionContext, ActionError
from trainwatch.remediation.config import Config


def context(tmp_path: Path, prometheus: str) -> ActionContext:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "collect.yml").write_text("- hosts: all\n  tasks: []\n")
    config = Config(webhook_token="w" * 32, training_exporter_token="t" * 32,
                    store_path=tmp_path / "r.db", prometheus_url=f"http://{prometheus}",
                    alertmanager_url="http://127.0.0.1:9",
                    ansible_playbooks_dir=tmp_path / "playbooks")
    return ActionContext(config, {"training_job": "llm-7"}, "key-1", requests.Session())


def test_a_failed_lookup_names_the_action_that_asked(tmp_path: Path) -> None:
    # A server that answers 200 with something other than a query result: the look-up fails
    # without waiting on a timeout.
    with stub_server() as (hostport, _):
        ctx = context(tmp_path, hostport)
        with pytest.raises(ActionError, match=r"^ansible: Prometheus query failed"):
            ansible.run({"action": "ansible", "playbook": "collect.yml",
                         "hosts_from": "job_nodes"}, ctx)
        with pytest.raises(ActionError, match=r"^training_command: Prometheus query failed"):
            training_command.run({"action": "training_command", "command": "scale_lr",
                                  "args": {"factor": 0.5}}, ctx)
