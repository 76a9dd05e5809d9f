"""Acceptance 2 and 3: real service processes sharing one store, on SQLite and on PostgreSQL
(`store_section`; issue 14 acceptance 3).

The action is an `http` step to a real loopback server that counts deliveries by the
Idempotency-Key header the service sends (the step's key is stable across retries and
restarts, so a receiver that honours it applies the action once)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tests.remediation.helpers import StubState, alert, payload, stub_server
from tests.remediation.processes import service_config, start_service
from tests.support.net import free_port, wait_until


def book(hostport: str) -> dict:
    return {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
            "target": ["training_job"],
            "steps": [{"action": "http", "url": f"http://{hostport}/act",
                       "json": {"job": "${labels.training_job}"}}]}


def test_ten_deliveries_to_two_processes_sharing_a_store_act_once(
        tmp_path: Path, store_section: dict[str, Any]) -> None:
    with stub_server() as (hostport, state):
        port_a, port_b = free_port(), free_port()
        config = service_config(tmp_path, [book(hostport)], port=port_a, **store_section)
        with start_service(config, port_a, "a.log") as a, \
                start_service(config, port_b, "b.log") as b:
            body = payload(alert("TrainingLossSpike", {"training_job": "once"},
                                 fingerprint="1234abcd"))
            answers = [(a if i % 2 else b).post(body) for i in range(10)]
            assert all(r.status_code == 200 for r in answers)
            assert sum(r.json()["accepted"] for r in answers) == 1
            wait_until(lambda: a.actions(decision="acted")["audit"], timeout=30,
                       what="the action to finish")
            # Both processes keep polling. A second, distinct alert acted on afterwards proves
            # the workers ran again since; the first must still have acted exactly once.
            later = payload(alert("TrainingLossSpike", {"training_job": "later"},
                                  fingerprint="5678abcd"))
            assert b.post(later).json()["accepted"] == 1
            wait_until(lambda: len([r for r in a.actions(decision="acted")["audit"]]) >= 2,
                       timeout=30, what="the second alert's action")
            assert len(state.posts("/act")) == 2
            audit = b.actions()["audit"]
            acted = [r for r in audit if r["decision"] == "acted"]
            assert sorted(r["fingerprint"] for r in acted) == ["1234abcd", "5678abcd"]
            assert sum(1 for r in audit if r["decision"] == "deduplicated") == 9


def test_kill9_between_accept_and_finish_completes_once_after_restart(
        tmp_path: Path, store_section: dict[str, Any]) -> None:
    gate = threading.Event()
    with stub_server(StubState(gate=gate)) as (hostport, state):
        port = free_port()
        config = service_config(tmp_path, [book(hostport)], port=port, lease_seconds=1.5,
                                **store_section)
        with start_service(config, port, "first.log") as first:
            body = payload(alert("TrainingLossSpike", {"training_job": "crash"},
                                 fingerprint="feedbeef"))
            assert first.post(body).json()["accepted"] == 1
            wait_until(lambda: state.posts("/act"), timeout=20, what="the action to start")
            first.proc.kill9()  # crash while the action is in flight, before it is recorded
        gate.set()  # the target finishes its first delivery (its answer goes nowhere)
        with start_service(config, port, "second.log") as second:
            wait_until(lambda: second.actions(decision="acted")["audit"], timeout=30,
                       what="the resumed action to finish")
            posts = state.posts("/act")
            keys = {p.headers.get("Idempotency-Key") for p in posts}
            assert len(keys) == 1 and None not in keys  # every delivery is the same action
            assert len(posts) == 2  # the crashed attempt and the resumed one, nothing more
            audit = second.actions()["audit"]
            assert sum(1 for r in audit if r["decision"] == "acted") == 1
            (intent,) = second.actions()["actions"]
            assert intent["state"] == "done" and intent["next_step"] == 1
