"""Stopping a node's torchrun agent stops exactly the agents of the ranks that report to that
node's exporter: processes that only mention torchrun in their argv (a log viewer given the
word, `tail -f .../log/torchrun`) are never signalled, even when they share the exporter's
environment."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.net import wait_until
from tests.support.procs import ManagedProcess
from tests.training.support import ELASTIC_ENV, elastic_torchrun
from trainwatch.exporters.contract.catalog import ENV_EXPORTER_SOCKET
from trainwatch.remediation.schedulers import torchrun_elastic

WORKER = """import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("up")
time.sleep(600)
"""
VIEWER = "import time\ntime.sleep(600)\n"


def test_stop_signals_the_agent_of_the_exporters_ranks_and_nothing_that_mentions_torchrun(
        tmp_path: Path) -> None:
    socket_path = str(tmp_path / "exporter.sock")
    env = {**ELASTIC_ENV, ENV_EXPORTER_SOCKET: socket_path}
    worker, viewer = tmp_path / "worker.py", tmp_path / "viewer.py"
    worker.write_text(WORKER)
    viewer.write_text(VIEWER)
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "torchrun").write_text("a log file named after the launcher\n")
    up = tmp_path / "worker.up"
    bystanders = [
        ManagedProcess([sys.executable, str(viewer), "torchrun"], tmp_path / "viewer.log",
                       env=env),
        ManagedProcess(["tail", "-f", str(tmp_path / "log" / "torchrun")],
                       tmp_path / "tail.log", env=env),
    ]
    other_socket = {**ELASTIC_ENV, ENV_EXPORTER_SOCKET: str(tmp_path / "other.sock")}
    agents = [ManagedProcess(elastic_torchrun(worker, str(up), nproc=1, max_restarts=0),
                             tmp_path / "agent.log", env=env),
              ManagedProcess(elastic_torchrun(worker, str(tmp_path / "other.up"), nproc=1,
                                              max_restarts=0),
                             tmp_path / "other-agent.log", env=other_socket)]
    try:
        wait_until(lambda: up.exists() and (tmp_path / "other.up").exists(), timeout=120,
                   interval=0.2, what="both agents' ranks running")
        result = torchrun_elastic.stop(None, socket_path, grace=30)
        assert [a["pid"] for a in result["stopped"]] == [agents[0].pid]
        wait_until(lambda: not agents[0].alive(), timeout=60, what="the agent stopped")
        assert all(p.alive() for p in bystanders), "a process that only mentions torchrun died"
        assert agents[1].alive(), "an agent whose ranks report to another exporter died"
    finally:
        for proc in (*agents, *bystanders):
            proc.stop()
