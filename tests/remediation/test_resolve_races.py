"""Issue 11 item 2: a resolved alert never acts afterwards, against a real service process.

Every interleaving the review found: (a) resolve while a firing step runs, (b) resolve while a
failed firing step waits to be retried, (c) approval given after resolve, (d) resolve delivered
before the firing notification. Each must cancel the firing steps not yet run (audited
`cancelled`) and run `on_resolve` exactly once when, and only when, a firing step ran."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import requests

from tests.remediation.helpers import APPROVERS, StubState, alert, auth, payload, stub_server
from tests.remediation.processes import RunningService, running_service
from tests.support.net import wait_until

FINAL = ("done", "failed", "refused", "rejected", "cancelled")


def book(name: str, alertname: str, steps: list[str], hostport: str, **extra: Any) -> dict:
    return {"name": name, "match": {"alertname": [alertname]}, "target": ["training_job"],
            "steps": [{"action": "http", "url": f"http://{hostport}{path}"} for path in steps],
            "on_resolve": [{"action": "http", "url": f"http://{hostport}/{name}/restore"}],
            **extra}


def intents(svc: RunningService, fingerprint: str) -> dict[str, dict[str, Any]]:
    return {i["phase"]: i for i in svc.actions()["actions"] if i["fingerprint"] == fingerprint}


def settled(svc: RunningService, fingerprint: str) -> dict[str, dict[str, Any]] | None:
    found = intents(svc, fingerprint)
    done = set(found) == {"fire", "resolve"} and all(
        i["state"] in FINAL for i in found.values())
    return found if done else None


def resolved(fired: dict[str, Any]) -> dict[str, Any]:
    return payload({**fired, "status": "resolved", "endsAt": "2026-11-21T19:00:00Z"})


def test_resolve_races_never_act_after_resolve(tmp_path: Path) -> None:
    gate = threading.Event()
    stub = StubState(gate=gate, gate_prefix="/running/slow", fail_prefix="/backoff/fail")
    with stub_server(stub) as (hp, state):
        books = [
            book("running", "TrainingLossSpike", ["/running/slow", "/running/second"], hp),
            book("backoff", "TrainingGradNormExplosion", ["/backoff/fail"], hp),
            book("approval", "TrainingNonFiniteLoss", ["/approval/act"], hp,
                 requires_approval=True),
        ]
        with running_service(tmp_path, books, max_attempts=3, retry_backoff_seconds=5.0,
                             worker_threads=2) as svc:
            # (a) resolved while the first firing step runs: the second step is cancelled,
            # on_resolve runs once, after the running step finished
            fired = alert("TrainingLossSpike", {"training_job": "a"}, fingerprint="a1")
            assert svc.post(payload(fired)).json()["accepted"] == 1
            wait_until(lambda: state.posts("/running/slow"), timeout=30, what="step 1 running")
            assert svc.post(resolved(fired)).json()["resolved"] == 1
            assert svc.post(resolved(fired)).json()["deduplicated"] == 1
            gate.set()
            found = wait_until(lambda: settled(svc, "a1"), timeout=60, what="(a) settled")
            assert found["fire"]["state"] == "cancelled" and found["fire"]["next_step"] == 1
            assert state.posts("/running/second") == []
            assert len(state.posts("/running/restore")) == 1
            assert found["resolve"]["decision"] == "resolve_act"

            # (b) resolved while a failed step waits for its retry: no retry, on_resolve once
            fired = alert("TrainingGradNormExplosion", {"training_job": "b"}, fingerprint="b1")
            assert svc.post(payload(fired)).json()["accepted"] == 1
            wait_until(lambda: state.posts("/backoff/fail"), timeout=30, what="first attempt")
            svc.post(resolved(fired))
            found = wait_until(lambda: settled(svc, "b1"), timeout=60, what="(b) settled")
            assert found["fire"]["state"] == "cancelled"
            wait_until(lambda: state.posts("/backoff/restore"), timeout=30, what="on_resolve")
            assert len(state.posts("/backoff/fail")) == 1
            assert len(state.posts("/backoff/restore")) == 1

            # (c) approval given after resolve: refused, nothing runs, nothing to undo
            fired = alert("TrainingNonFiniteLoss", {"training_job": "c"}, fingerprint="c1")
            intent_id = svc.post(payload(fired)).json()["intents"][0]
            wait_until(lambda: svc.actions(state="awaiting_approval")["actions"], timeout=30,
                       what="awaiting approval")
            svc.post(resolved(fired))
            found = wait_until(lambda: settled(svc, "c1"), timeout=60, what="(c) settled")
            answer = requests.post(f"{svc.url}/v1/actions/{intent_id}/approve",
                                   headers=auth(APPROVERS["alice"]), timeout=10)
            assert answer.status_code == 409, answer.text
            assert found["fire"]["state"] == "cancelled"
            assert found["resolve"]["decision"] == "resolved_recorded"

            # (d) the resolve delivered before the firing notification: the firing one never acts
            fired = alert("TrainingLossSpike", {"training_job": "d"}, fingerprint="d1")
            svc.post(resolved(fired))
            svc.post(payload(fired))
            found = wait_until(lambda: settled(svc, "d1"), timeout=60, what="(d) settled")
            assert found["fire"]["state"] == "cancelled"
            assert found["resolve"]["decision"] == "resolved_recorded"

            audit = svc.actions()["audit"]
            cancelled = {r["fingerprint"] for r in audit if r["decision"] == "cancelled"}
            assert cancelled == {"a1", "b1", "c1", "d1"}
            assert len(state.posts("/running/slow")) == 1  # (d) never ran it
            assert state.posts("/approval/") == []


def test_resolve_after_a_crash_mid_step_runs_on_resolve_once(
        tmp_path: Path, store_section: dict) -> None:
    """(e) the process running a firing step is killed (-9); the resolve reaches the restarted
    one: the remaining firing step never runs, on_resolve runs exactly once."""
    from tests.remediation.processes import service_config, start_service
    from tests.support.net import free_port

    gate = threading.Event()
    with stub_server(StubState(gate=gate, gate_prefix="/crash/slow")) as (hp, state):
        port = free_port()
        # The dead process's lease must outlast the restart and the resolve's POST: with a
        # short one, a loaded machine let the restarted service take the firing intent over
        # and finish its second step before the resolve arrived (state 'done', not
        # 'cancelled'), which is not the race this test is about.
        config = service_config(tmp_path, [book("crash", "TrainingLossSpike",
                                                ["/crash/slow", "/crash/second"], hp)],
                                port=port, lease_seconds=10, **store_section)
        fired = alert("TrainingLossSpike", {"training_job": "e"}, fingerprint="e1")
        with start_service(config, port, "first.log") as first:
            assert first.post(payload(fired)).json()["accepted"] == 1
            wait_until(lambda: state.posts("/crash/slow"), timeout=30, what="step 1 running")
            first.proc.kill9()
        gate.set()
        with start_service(config, port, "second.log") as second:
            assert second.post(resolved(fired)).json()["resolved"] == 1
            found = wait_until(lambda: settled(second, "e1"), timeout=60, what="settled")
            assert found["fire"]["state"] == "cancelled"
            assert found["resolve"]["decision"] == "resolve_act"
            assert state.posts("/crash/second") == []
            assert len(state.posts("/crash/restore")) == 1
