"""A fatal XID reaches remediation twice: the GPU exporter's fast alert at once, the rule's own
alert (GpuXidErrors, `for: 1m` in production) a minute or two later. The fast alert drains the
node; if a person returns the node (trainwatch-resume-node) before the rule's alert arrives,
that alert is the same event and must not drain the node again. A new event on the returned
node (its own fast alert), or a rule alert no fast alert of this node came before, still drains
it. The quarantine rails on both stores, without a scheduler (the plan is built here as the
action would build it from the alert's labels)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.remediation.helpers import write_config
from trainwatch.remediation.actions.base import RailsContext
from trainwatch.remediation.actions.quarantine import (
    GRANT_PLAYBOOK,
    QuarantinePlan,
    end_quarantine,
    granted,
    rails,
)
from trainwatch.remediation.config import SchedulerSettings, load_config
from trainwatch.remediation.decisions import Decision
from trainwatch.remediation.faults import Fault
from trainwatch.remediation.store import NewIntent, Store
from trainwatch.remediation.stores import open_store

NODE = "tw-gpu-01"
POOL = ("tw-gpu-01", "tw-gpu-02", "tw-gpu-03", "tw-gpu-04")
SETTINGS = SchedulerSettings()  # rule_alert_lag 3m, the production profile's default


def decide(store: Store, *, fault_at: float, now: float, fast: bool,
           state: str = "done") -> Decision | None:
    """The quarantine rails for one XID alert on NODE (the fast one, or the rule's), and the
    grant if they let it drain; `state` is the intent's state afterwards (a drain that failed
    for good leaves `failed`)."""
    context = RailsContext(approved=False, approved_rails=frozenset(), observe_only=False,
                           now=now, alertname="GpuXidErrors")
    with store.transaction() as tx:
        intent_id = tx.insert_intent(NewIntent(
            fingerprint=f"{fast}{fault_at}", starts_at="t", playbook="node_quarantine",
            phase="fire", alertname="GpuXidErrors", labels={}, annotations={},
            target_key=NODE, state=state))
        fault = Fault("GpuXidErrors", "hardware", "quarantine", (NODE,), "XID 79")
        plan = QuarantinePlan(intent_id, fault, POOL, (), fault_at=fault_at, fast=fast)
        verdict = rails(tx, plan, SETTINGS, context)
        if verdict is None:
            granted(tx, plan, SETTINGS, now, context.alertname)
            return None
        return verdict.decision


def resume(store: Store, now: float) -> None:
    """trainwatch-resume-node's write: the node's quarantine no longer holds."""
    with store.transaction() as tx:
        assert end_quarantine(tx, NODE, now) >= 1


def test_the_rule_alert_of_an_event_the_fast_alert_drained_for_drains_nothing_again(
        tmp_path: Path, store_section: dict[str, Any]) -> None:
    store = open_store(load_config(write_config(tmp_path, **store_section)))
    xid = 1_000_000.0
    assert decide(store, fault_at=xid, now=xid + 0.5, fast=True) is None  # drained at once
    # the rule's alert while the drain holds: already quarantined, as before
    assert decide(store, fault_at=xid + 75, now=xid + 76,
                  fast=False) == Decision.ALREADY_QUARANTINED
    resume(store, xid + 60)
    # a person returned the node after a minute; the rule's alert of the same XID (it began
    # 75 s after the event: scrape, evaluation, `for: 1m`) arrives after that
    assert decide(store, fault_at=xid + 90, now=xid + 95, fast=False) == Decision.ALREADY_HEALED
    # a new XID on the returned node: its own fast alert drains it again at once
    assert decide(store, fault_at=xid + 120, now=xid + 120.5, fast=True) is None
    resume(store, xid + 400)
    # a rule alert beginning past rule_alert_lag after every fast drain is a fault of its own
    # (its fast alert was lost: Alertmanager away, the exporter's queue full)
    assert decide(store, fault_at=xid + 120 + SETTINGS.rule_alert_lag_seconds + 1,
                  now=xid + 500, fast=False) is None
    with store.transaction() as tx:
        assert len(tx.grant_history(GRANT_PLAYBOOK, xid - 1, NODE)) == 3


def test_a_fast_drain_that_failed_for_good_leaves_the_rule_alert_to_drain(
        tmp_path: Path, store_section: dict[str, Any]) -> None:
    store = open_store(load_config(write_config(tmp_path, **store_section)))
    xid = 2_000_000.0
    # the fast alert's drain failed for good (the scheduler away past retry_until)
    assert decide(store, fault_at=xid, now=xid + 0.5, fast=True, state="failed") is None
    assert decide(store, fault_at=xid + 75, now=xid + 80, fast=False) is None


def test_a_fast_alert_from_a_clock_ahead_absorbs_no_later_fault(
        tmp_path: Path, store_section: dict[str, Any]) -> None:
    """The node's clock runs an hour ahead: its fast alert's startsAt is in the future. The
    drain is recorded at the decision's time instead, so a new fault's rule alert an hour
    later is not taken for that event."""
    store = open_store(load_config(write_config(tmp_path, **store_section)))
    now = 3_000_000.0
    assert decide(store, fault_at=now + 3600, now=now, fast=True) is None
    resume(store, now + 60)
    assert decide(store, fault_at=now + 3595, now=now + 3600, fast=False) is None
