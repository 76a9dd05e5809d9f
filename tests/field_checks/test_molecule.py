"""The molecule scenario ansible/molecule/stack run as the field runs it: `molecule test -s
stack` (syntax, converge, idempotence, testinfra verify, destroy) against this machine, with
the default (delegated) driver, a prefix of its own and free ports.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ansible.runner import ANSIBLE, ansible_env
from tests.support.net import free_port

pytestmark = pytest.mark.slow

PORT_VARS = ("prometheus_port", "alertmanager_port", "node_exporter_port", "gpu_exporter_port",
             "training_exporter_port", "log_scanner_port", "remediation_port",
             "victoriametrics_port")


def test_molecule_stack_scenario(tmp_path: Path, real_binaries: dict[str, str]) -> None:
    vars_file = tmp_path / "vars.yml"
    vars_file.write_text(yaml.safe_dump({"trainwatch_prefix": str(tmp_path / "prefix"),
                                         **{name: free_port() for name in PORT_VARS}}))
    env = {**ansible_env(), "TRAINWATCH_MOLECULE_VARS": str(vars_file),
           # molecule keeps its state here instead of ~/.cache
           "MOLECULE_EPHEMERAL_DIRECTORY": str(tmp_path / "molecule")}
    proc = subprocess.run([str(Path(env["PATH"].split(":")[0]) / "molecule"), "test", "-s",
                           "stack"], cwd=ANSIBLE, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
