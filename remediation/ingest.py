"""Turn one validated webhook payload into durable intents and audit rows, in one transaction.

Nothing here runs an action: the caller answers 2xx right after this commits, and the worker
acts later. Alerts that will never act (bad/missing target labels, no playbook, resolved
without undo steps) are decided here so that the audit says why at once.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from remediation.labels import LabelError, safe_labels
from remediation.playbooks import Playbook, matching
from remediation.store import NewIntent, Store

log = logging.getLogger(__name__)
ESCALATION_PLAYBOOK = "_truncated_alerts_escalation"


@dataclass
class IngestResult:
    accepted: int = 0
    deduplicated: int = 0
    refused: int = 0
    resolved: int = 0
    unmatched: int = 0
    intents: list[int] = field(default_factory=list)


def target_key(book: Playbook, labels: Mapping[str, str]) -> str:
    """The cooldown / rate-limit key, e.g. 'training_job=llm-7'; raises LabelError (fail closed)
    when a target label is missing, or any label the playbook uses is not allowlisted."""
    safe = safe_labels(labels, sorted(book.used_labels))
    return ",".join(f"{name}={safe[name]}" for name in book.target)


def ingest(store: Store, books: Mapping[str, Playbook], payload: dict[str, Any],
           *, escalate: bool) -> IngestResult:
    """Record one payload in its own transaction."""
    with store.transaction() as conn:
        return ingest_in(store, conn, books, payload, escalate=escalate)


def ingest_in(store: Store, conn: Any, books: Mapping[str, Playbook], payload: dict[str, Any],
              *, escalate: bool) -> IngestResult:
    """Record one payload inside the caller's transaction (the group committer batches many)."""
    result = IngestResult()
    truncated = int(payload.get("truncatedAlerts", 0) or 0)
    if truncated > 0:
        _record_truncation(store, conn, payload, truncated, escalate, result)
    for alert in payload["alerts"]:
        labels: dict[str, str] = alert["labels"]
        annotations: dict[str, str] = alert.get("annotations", {})
        phase = "fire" if alert["status"] == "firing" else "resolve"
        books_for_alert = matching(books, labels)
        base = {"fingerprint": alert["fingerprint"], "starts_at": alert["startsAt"],
                "phase": phase, "alertname": labels["alertname"], "labels": labels,
                "annotations": annotations}
        if not books_for_alert:
            new_id = store.insert_intent(conn, NewIntent(
                playbook="", target_key=None, state="done", decision="unmatched", **base))
            if new_id:
                result.unmatched += 1
                store.audit(conn, "unmatched", intent_id=new_id,
                            fingerprint=alert["fingerprint"], alertname=labels["alertname"],
                            reason="no playbook matches this alert")
            continue
        for book in books_for_alert:
            _ingest_one(store, conn, book, base, result)
    return result


def _ingest_one(store: Store, conn: Any, book: Playbook, base: dict[str, Any],
                result: IngestResult) -> None:
    audit_ids = {"fingerprint": base["fingerprint"], "playbook": book.name,
                 "alertname": base["alertname"]}
    try:
        key: str | None = target_key(book, base["labels"])
        refusal = None
    except LabelError as exc:
        key, refusal = None, str(exc)
    if base["phase"] == "resolve":
        runnable = bool(book.on_resolve) and refusal is None
        state, decision = ("pending", None) if runnable else ("done", "resolved_recorded")
    elif refusal:
        state, decision = "refused", "refused"
    else:
        state, decision = "pending", None
    new_id = store.insert_intent(conn, NewIntent(playbook=book.name, target_key=key,
                                                 state=state, decision=decision, **base))
    if new_id is None:
        result.deduplicated += 1
        existing = conn.execute(
            "SELECT id FROM intents WHERE fingerprint=? AND starts_at=? AND playbook=? AND phase=?",
            (base["fingerprint"], base["starts_at"], book.name, base["phase"])).fetchone()
        store.audit(conn, "deduplicated", intent_id=existing[0] if existing else None,
                    target_key=key,
                    reason="same fingerprint, startsAt and playbook already recorded", **audit_ids)
        return
    result.intents.append(new_id)
    if base["phase"] == "resolve":
        result.resolved += 1
        reason = "resolved; on_resolve steps queued" if state == "pending" else (
            refusal or "resolved; playbook has no on_resolve steps")
        store.audit(conn, "resolved_recorded", intent_id=new_id, target_key=key, reason=reason,
                    **audit_ids)
    elif refusal:
        result.refused += 1
        store.audit(conn, "refused", intent_id=new_id, reason=refusal, **audit_ids)
    else:
        result.accepted += 1


def _record_truncation(store: Store, conn: Any, payload: dict[str, Any], truncated: int,
                       escalate: bool, result: IngestResult) -> None:
    """Alertmanager dropped alerts from this notification (max_alerts): they can never be acted
    on, so a human must look. Recorded once per group and count, then escalated."""
    group = str(payload.get("groupKey", ""))
    fingerprint = hashlib.sha256(group.encode()).hexdigest()[:16]
    new_id = store.insert_intent(conn, NewIntent(
        fingerprint=fingerprint, starts_at=f"truncated:{truncated}",
        playbook=ESCALATION_PLAYBOOK, phase="fire", alertname="TruncatedAlerts",
        labels={"receiver": str(payload.get("receiver", ""))[:128]},
        annotations={"groupKey": group[:1024], "truncatedAlerts": str(truncated)},
        target_key="global", state="pending" if escalate else "done",
        decision=None if escalate else "truncated_escalated"))
    if new_id is None:
        return
    log.error("Alertmanager truncated %d alerts of group %r: they cannot be remediated",
              truncated, group[:200])
    store.audit(conn, "truncated_escalated", intent_id=new_id, fingerprint=fingerprint,
                playbook=ESCALATION_PLAYBOOK, alertname="TruncatedAlerts",
                reason=f"{truncated} alerts truncated by Alertmanager; "
                       + ("paging" if escalate else "no pager_url configured, logged + metric"),
                detail={"groupKey": group[:1024], "truncatedAlerts": truncated})
    result.intents.append(new_id)
