"""The one restart/reload path of every service role (trainwatch/tasks/control.yml) with a
real dedicated supervisord: a service started or restarted in a play is never reloaded (or
restarted again) right after it, and a reload alone still reaches the running process.

The probe program records each start and each SIGHUP it receives; each scenario is one
ansible-playbook run of a test role whose handlers are written exactly like the service roles'.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ansible.runner import STOP, run_playbook
from tests.support.net import wait_until

pytestmark = pytest.mark.slow  # four ansible-playbook runs

PLAYBOOK = Path(__file__).with_name("handler_probe.yml")


def events(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_no_reload_right_after_a_start_or_restart(tmp_path: Path,
                                                  real_binaries: dict[str, str]) -> None:
    log = tmp_path / "events"
    base = {"trainwatch_prefix": str(tmp_path / "prefix"), "trainwatch_service_manager":
            "supervisor", "trainwatch_venv_enabled": False, "probe_events": str(log)}

    def converge(reload: bool, restart: bool) -> None:
        run = run_playbook(PLAYBOOK, {**base, "probe_reload": reload, "probe_restart": restart},
                           tmp_path)
        assert run.rc == 0 and run.total("failed") == 0, run.describe()

    try:
        # first start, with both a reload and a restart pending: one start, nothing else
        converge(reload=True, restart=True)
        wait_until(lambda: events(log) == ["start"], timeout=30, what="the first start")
        # a reload alone reaches the running process
        converge(reload=True, restart=False)
        wait_until(lambda: events(log) == ["start", "hup"], timeout=30, what="the reload")
        # restart and reload pending: one restart, and no reload after it
        converge(reload=True, restart=True)
        wait_until(lambda: events(log)[2:] == ["start"], timeout=30, what="the restart")
        assert events(log) == ["start", "hup", "start"]
    finally:
        stop = run_playbook(STOP, base, tmp_path)
        assert stop.rc == 0, stop.describe()
