"""The local inventory in check mode against a fresh host, and the helpers other deploy
tests share.

The real deployment of the local inventory (converged twice, the second run changing
nothing, verified through the services' own APIs, stopped with trainwatch.stack.stop leaving no
process behind) is the molecule scenario ansible/molecule/stack, run by
tests/field_checks/test_molecule.py: one pair of converges for the suite, not two.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.ansible.runner import SITE, run_playbook
from tests.support.net import free_port

pytestmark = pytest.mark.slow

# The console scripts the roles start (pyproject.toml [project.scripts]).
ENTRY_MODULES = ("trainwatch.exporters.node.training.server", "trainwatch.exporters.node.gpu.cli",
"trainwatch.exporters.node.logs.scanner_cli",
                 "trainwatch.remediation.server")
PORT_VARS = ("prometheus_port", "alertmanager_port", "node_exporter_port", "gpu_exporter_port",
             "training_exporter_port", "log_scanner_port", "remediation_port")


def processes_under(prefix: Path) -> list[str]:
    """Command lines of live processes that mention the deployment prefix."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(prefix) in cmdline:
            found.append(f"{entry.name}: {cmdline.strip()}")
    return found


def missing_entry_modules() -> list[str]:
    return [name for name in ENTRY_MODULES if importlib.util.find_spec(name) is None]


def test_check_mode_against_a_fresh_host_succeeds(tmp_path: Path,
                                                    real_binaries: dict[str, str]) -> None:
    prefix = tmp_path / "fresh"
    ports = {name: free_port() for name in PORT_VARS}
    run = run_playbook(SITE, {"trainwatch_prefix": str(prefix), **ports}, tmp_path,
                       check=True)
    assert run.rc == 0 and run.total("failed") == 0, run.describe()
    assert run.total("changed") > 0, run.describe()  # it would create the whole stack
    assert not processes_under(prefix)
    assert not os.path.exists(prefix / "venv")  # check mode wrote nothing
