"""The molecule scenario ansible/molecule/stack run as the field runs it: `molecule test -s
stack` (syntax, converge, idempotence, testinfra verify, destroy) against this machine, with
the default (delegated) driver, a prefix of its own and free ports.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ansible.runner import ANSIBLE, STOP, VENV_BIN, ansible_env, run_playbook
from tests.ansible.test_local_deploy import processes_under
from tests.support.net import free_port, wait_until

pytestmark = pytest.mark.slow

PORT_VARS = ("prometheus_port", "alertmanager_port", "node_exporter_port", "gpu_exporter_port",
             "training_exporter_port", "log_scanner_port", "remediation_port",
             "victoriametrics_port")
# Two converges of the whole stack: about 3 min on a quiet 2-core machine, far more when it
# is shared; the limit only catches a hang.
TIMEOUT = 1800
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # molecule colours its step lines even into a pipe


def test_molecule_stack_scenario(tmp_path: Path, real_binaries: dict[str, str]) -> None:
    extra_vars = {"trainwatch_prefix": str(tmp_path / "prefix"),
                  **{name: free_port() for name in PORT_VARS}}
    vars_file = tmp_path / "vars.yml"
    vars_file.write_text(yaml.safe_dump(extra_vars))
    env = {**ansible_env(), "TRAINWATCH_MOLECULE_VARS": str(vars_file), "NO_COLOR": "1",
           # molecule keeps its state here instead of ~/.cache
           "MOLECULE_EPHEMERAL_DIRECTORY": str(tmp_path / "molecule")}
    proc = subprocess.Popen([str(VENV_BIN / "molecule"), "test", "-s", "stack"], cwd=ANSIBLE,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        # molecule's destroy never ran: stop what the converge started
        stop = run_playbook(STOP, extra_vars, tmp_path)
        pytest.fail(f"molecule test ran past {TIMEOUT} s (stop.yml rc={stop.rc})")
    output = ANSI.sub("", output)
    assert proc.returncode == 0, output[-8000:]
    for step in ("syntax", "converge", "idempotence", "verify", "destroy"):
        assert f"[stack > {step}] Executed: Successful" in output, step
    for token_file in ("control.token", "remediation-webhook.token"):
        token = (tmp_path / "prefix" / "etc" / token_file).read_text().strip()
        assert len(token) >= 32
        assert token not in output
    # destroy (stop.yml) left nothing of the deployment running
    prefix = tmp_path / "prefix"
    try:
        wait_until(lambda: not processes_under(prefix), timeout=30,
                   what="every process of the deployment to exit")
    except TimeoutError:
        pytest.fail(f"processes left after destroy: {processes_under(prefix)}")
