"""Issue 11 item 9a (per-priority circuit breakers) and 9b (running counters for /metrics,
audit retention that never drops an unfinished intent's history)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.remediation.helpers import REPO, alert, auth, payload, stub_server
from trainwatch.remediation.metrics import StoreCollector
from trainwatch.remediation.playbooks import load_playbooks
from trainwatch.remediation.store import NewIntent, Store, Transaction


def http_book(name: str, alertname: str, hostport: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "match": {"alertname": [alertname]}, "target": ["training_job"],
            "steps": [{"action": "http", "url": f"http://{hostport}/{name}/${{labels.training_job}}"}],
            **extra}


def test_low_priority_actions_cannot_block_a_checkpoint_rollback(service_factory) -> None:
    with stub_server() as (hostport, state):
        books = [http_book("cleanup", "NodeDiskFilling", hostport, priority="low"),
                 http_book("rollback", "TrainingNonFiniteLoss", hostport, priority="high")]
        with service_factory(books, circuit_breaker={"max_actions": 3, "window": "1h"}) as svc:
            svc.client.post("/v1/alerts", headers=auth(), json=payload(*[
                alert("NodeDiskFilling", {"training_job": f"j{i}"}) for i in range(5)]))
            svc.wait_idle()
            assert len(state.posts("/cleanup/")) == 3  # the low breaker opened
            svc.client.post("/v1/alerts", headers=auth(), json=payload(
                alert("TrainingNonFiniteLoss", {"training_job": "llm"})))
            svc.wait_idle()
            assert [r.path for r in state.posts("/rollback/")] == ["/rollback/llm"]
            refused = svc.audit("refused")
            assert len(refused) == 2 and all("(low priority)" in r["reason"] for r in refused)
            text = svc.client.get("/metrics").data.decode()
            assert 'circuit_breaker_priority_open{priority="low"} 1.0' in text
            assert 'circuit_breaker_priority_open{priority="high"} 0.0' in text


def test_shipped_checkpoint_rollback_is_high_priority() -> None:
    books = load_playbooks(REPO / "remediation" / "playbooks")
    assert books["checkpoint_rollback"].priority == "high"


def test_metrics_read_running_counters_not_the_audit_table(service_factory) -> None:
    with service_factory([http_book("page", "TrainingLossSpike", "127.0.0.1:1")],
                         start_worker=False) as svc:
        for i in range(3):
            svc.client.post("/v1/alerts", headers=auth(), json=payload(
                alert("TrainingLossSpike"), alert("Other", {"training_job": f"x{i}"})))
        statements: list[str] = []
        conn = svc.store._conn()
        conn.set_trace_callback(statements.append)
        try:
            families = {f.name: f for f in StoreCollector(svc.store, svc.config).collect()}
        finally:
            conn.set_trace_callback(None)
        assert not [s for s in statements if "audit" in s.lower()], statements
        decisions = {s.labels["decision"]: s.value
                     for s in families["trainwatch_remediation_decisions"].samples}
        assert decisions == {"refused": 3, "unmatched": 3}


def _intent(tx: Transaction, fp: str, phase: str, state: str) -> int:
    new_id = tx.insert_intent(NewIntent(
        fingerprint=fp, starts_at="t", playbook="page", phase=phase, alertname="A", labels={},
        annotations={}, target_key="k", state=state))
    assert new_id is not None
    tx.audit("acted" if state == "done" else "awaiting_approval", intent_id=new_id,
             playbook="page", action="http")
    return new_id


def test_retention_keeps_unfinished_intents_and_the_totals(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    with store.transaction() as tx:
        finished = _intent(tx, "f1", "fire", "done")
        _intent(tx, "f1", "resolve", "done")
        still_firing = _intent(tx, "f2", "fire", "done")  # never resolved: key must stay
        waiting = _intent(tx, "f3", "fire", "awaiting_approval")
    before = store.decision_counts()
    removed = store.prune(-1)
    assert removed == (2, 3)
    left = {i["id"] for i in store.list_intents(100)}
    assert left == {still_firing, waiting}
    assert finished not in left
    assert {a["intent_id"] for a in store.list_audit(100)} == {waiting}
    assert store.decision_counts() == before  # counters survive retention
    with pytest.raises(sqlite3.IntegrityError, match="append-only"), \
            store.transaction() as tx:
        tx.execute("DELETE FROM audit WHERE intent_id=?", (waiting,))
    with pytest.raises(sqlite3.IntegrityError, match="only moves forward"), \
            store.transaction() as tx:
        tx.execute("UPDATE retention SET horizon=0")
