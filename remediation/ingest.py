"""Turn one validated webhook payload into durable intents and audit rows, in one transaction.

Nothing here runs an action: the caller answers 2xx right after this commits, and the worker
acts later. Alerts that will never act (bad/missing target labels, no playbook, resolved
without undo steps) are decided here so that the audit says why at once.

Each alert is validated and recorded on its own (under its own SAVEPOINT): an alert that is
malformed (schema, oversize field, text that is not valid Unicode) is recorded as `invalid`
with the reason and its neighbours are accepted, so one bad alert never turns the whole
notification into a 4xx (which Alertmanager drops) or a 5xx (which it retries forever).

A resolved alert cancels its firing intent's steps that have not started (audited
`cancelled`); a firing intent that is running notices the resolve at its next step boundary
(trainwatch.remediation.engine).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from trainwatch.remediation import lifecycle
from trainwatch.remediation.actions.registry import retries_when_fired_again
from trainwatch.remediation.labels import LabelError, safe_labels
from trainwatch.remediation.playbooks import Playbook, matching
from trainwatch.remediation.schemas import first_error
from trainwatch.remediation.store import NewIntent, Store, Transaction

log = logging.getLogger(__name__)
ESCALATION_PLAYBOOK = "_truncated_alerts_escalation"
INVALID_PLAYBOOK = "_invalid_alert"
MAX_REASON = 500
FINGERPRINT = re.compile(r"[0-9a-f]{1,32}")  # as in schemas/alert.schema.json


def escalation_playbook() -> Playbook:
    """Built in: page a human when Alertmanager truncated alerts from a notification."""
    return Playbook(
        name=ESCALATION_PLAYBOOK, alertnames=frozenset({"TruncatedAlerts"}), matchers=(),
        target=(), steps=({"action": "http", "url": "${config.pager_url}", "json": {
            "event": "truncated_alerts",
            "summary": "Alertmanager truncated alerts from a remediation notification: they "
                       "were not remediated; see GET /v1/actions?decision=truncated_escalated"}},))


@dataclass
class IngestResult:
    accepted: int = 0
    deduplicated: int = 0
    refused: int = 0
    resolved: int = 0
    unmatched: int = 0
    invalid: int = 0
    intents: list[int] = field(default_factory=list)


def target_key(book: Playbook, labels: Mapping[str, str]) -> str:
    """The cooldown / rate-limit key, e.g. 'training_job=llm-7'; raises LabelError (fail closed)
    when a target label is missing, or any label the playbook uses is not allowlisted."""
    safe = safe_labels(labels, sorted(book.used_labels))
    return ",".join(f"{name}={safe[name]}" for name in book.target)


def alert_problems(alerts: list[Any]) -> list[str | None]:
    """Each alert's problem (alert_problem), computed before any transaction: validation is
    CPU work (a 10,000-alert notification takes seconds of jsonschema), and done inside the
    store's single write transaction it would hold up every other delivery and worker."""
    return [alert_problem(alert) for alert in alerts]


def ingest(store: Store, books: Mapping[str, Playbook], payload: dict[str, Any],
           *, escalate: bool) -> IngestResult:
    """Record one payload in its own transaction."""
    problems = alert_problems(payload["alerts"])
    with store.transaction() as tx:
        return ingest_in(store, tx, books, payload, escalate=escalate, problems=problems)


def ingest_in(store: Store, tx: Transaction, books: Mapping[str, Playbook], payload: dict[str, Any],
              *, escalate: bool, problems: list[str | None] | None = None,
              part: tuple[int, int] | None = None,
              result: IngestResult | None = None) -> IngestResult:
    """Record one payload, or the alerts `part` = (start, stop) of it, inside the caller's
    transaction (the group committer batches many, and splits a large payload into parts so
    that it never holds the write transaction for long). `problems` are the alerts' problems
    from alert_problems(), computed outside the transaction (when None: here, one by one);
    `result` accumulates over the parts of one payload. The envelope was validated by the
    caller."""
    result = result if result is not None else IngestResult()
    alerts = payload["alerts"]
    start, stop = part if part is not None else (0, len(alerts))
    truncated = int(payload.get("truncatedAlerts", 0) or 0)
    if truncated > 0 and start == 0:
        _record_truncation(tx, payload, truncated, escalate, result)
    if stop - start > 1:
        # Fast path: the whole part under one savepoint. A savepoint per alert costs a round
        # trip each way on PostgreSQL, and thousands of subtransactions in one transaction
        # slow every statement after them; one alert that fails to record sends the part
        # down the slow path below, which records it alert by alert.
        before = replace(result, intents=list(result.intents))
        try:
            with tx.savepoint("part"):
                for index in range(start, stop):
                    _ingest_checked(tx, books, alerts[index], problems, index, result)
        except Exception as exc:
            if store.is_storage_failure(exc):
                raise
            result.__dict__.update(before.__dict__)
        else:
            return result
    for index in range(start, stop):
        alert = alerts[index]
        try:
            with tx.savepoint("alert"):
                _ingest_checked(tx, books, alert, problems, index, result)
        except Exception as exc:  # this alert only: record why, keep its neighbours
            if store.is_storage_failure(exc):
                raise  # nothing can be recorded: the delivery fails (5xx) and is retried
            log.exception("recording an alert failed")
            _record_invalid(tx, alert, f"could not be recorded: {type(exc).__name__}", result)
    return result


def _ingest_checked(tx: Transaction, books: Mapping[str, Playbook], alert: Any,
                    problems: list[str | None] | None, index: int,
                    result: IngestResult) -> None:
    problem = problems[index] if problems is not None else alert_problem(alert)
    if problem:
        _record_invalid(tx, alert, problem, result)
    else:
        _ingest_alert(tx, books, alert, result)


def printable(value: object, limit: int = 256) -> str:
    """Text safe to store and log: lone surrogates escaped, length capped."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:limit]


def _unicode_problem(value: Any, path: str) -> str | None:
    """The first string (key or value) that is not valid Unicode, e.g. a lone surrogate that
    JSON's \\ud800 escape can carry: SQLite, UTF-8 logs and Ansible would all choke on it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{path}: not valid Unicode (lone surrogate)"
    elif isinstance(value, dict):
        for key, item in value.items():
            problem = _unicode_problem(key, f"{path}/<key>") or _unicode_problem(
                item, f"{path}/{printable(key, 64)}")
            if problem:
                return problem
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problem = _unicode_problem(item, f"{path}/{index}")
            if problem:
                return problem
    return None


def alert_problem(alert: Any) -> str | None:
    """Why this alert cannot be used (schema, sizes, Unicode), or None."""
    try:
        problem = first_error("alert", alert)
    except RecursionError:
        return "alert nested too deeply"
    if problem:
        return printable(problem, MAX_REASON)
    return _unicode_problem(alert, "alert")


def _record_invalid(tx: Transaction, alert: Any, problem: str,
                    result: IngestResult) -> None:
    """An invalid alert is kept as a finished intent (so a redelivery is a duplicate, not a new
    audit row each time) with its reason; only printable, size-capped text is stored."""
    fields = alert if isinstance(alert, dict) else {}
    labels = fields.get("labels") if isinstance(fields.get("labels"), dict) else {}
    fingerprint = fields.get("fingerprint")
    if not (isinstance(fingerprint, str) and FINGERPRINT.fullmatch(fingerprint)):
        digest = json.dumps(alert, sort_keys=True, default=str)  # ascii: surrogates escaped
        fingerprint = "invalid:" + hashlib.sha256(digest.encode()).hexdigest()[:16]
    starts_at = printable(fields.get("startsAt", ""), 64)
    alertname = printable(labels.get("alertname", ""), 256)
    reason = printable(problem, MAX_REASON)
    new_id = lifecycle.receive(tx, NewIntent(
        fingerprint=fingerprint, starts_at=starts_at, playbook=INVALID_PLAYBOOK, phase="fire",
        alertname=alertname, labels={}, annotations={}, target_key=None, state="done",
        decision="invalid"), "invalid", fingerprint=fingerprint, playbook=INVALID_PLAYBOOK,
        alertname=alertname, reason=reason)
    result.invalid += 1
    if new_id is not None:
        result.intents.append(new_id)


def _ingest_alert(tx: Transaction, books: Mapping[str, Playbook], alert: dict[str, Any],
                  result: IngestResult) -> None:
    labels: dict[str, str] = alert["labels"]
    annotations: dict[str, str] = alert.get("annotations", {})
    phase = "fire" if alert["status"] == "firing" else "resolve"
    books_for_alert = matching(books, labels)
    base = {"fingerprint": alert["fingerprint"], "starts_at": alert["startsAt"],
            "phase": phase, "alertname": labels["alertname"], "labels": labels,
            "annotations": annotations}
    if not books_for_alert:
        new_id = lifecycle.receive(
            tx, NewIntent(playbook="", target_key=None, state="done", decision="unmatched",
                          **base),
            "unmatched", fingerprint=alert["fingerprint"], alertname=labels["alertname"],
            reason="no playbook matches this alert")
        if new_id:
            result.unmatched += 1
        return
    for book in books_for_alert:
        _ingest_one(tx, book, base, result)


def _ingest_one(tx: Transaction, book: Playbook, base: dict[str, Any],
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
    new = NewIntent(playbook=book.name, target_key=key, state=state, decision=decision, **base)
    new_id = lifecycle.receive(tx, new)
    if new_id is None and base["phase"] == "fire" and retries_when_fired_again(book.steps) \
            and lifecycle.retry_failed(tx, tx.partner(new, "fire"), tx.now):
        result.accepted += 1
        return
    if new_id is None:
        result.deduplicated += 1
        lifecycle.duplicate(tx, new, "same fingerprint, startsAt and playbook already recorded")
        return
    result.intents.append(new_id)
    if base["phase"] == "resolve":
        lifecycle.cancel_unstarted(tx, tx.partner(new, "fire"))
        result.resolved += 1
        reason = "resolved; on_resolve steps queued" if state == "pending" else (
            refusal or "resolved; playbook has no on_resolve steps")
        tx.audit("resolved_recorded", intent_id=new_id, target_key=key, reason=reason,
                 **audit_ids)
    elif refusal:
        result.refused += 1
        tx.audit("refused", intent_id=new_id, reason=refusal, **audit_ids)
    else:
        result.accepted += 1


def _record_truncation(tx: Transaction, payload: dict[str, Any], truncated: int,
                       escalate: bool, result: IngestResult) -> None:
    """Alertmanager dropped alerts from this notification (max_alerts): they can never be acted
    on, so a human must look. Recorded once per group and count, then escalated."""
    group = printable(payload.get("groupKey", ""), 4096)
    fingerprint = hashlib.sha256(group.encode()).hexdigest()[:16]
    new_id = tx.insert_intent(NewIntent(
        fingerprint=fingerprint, starts_at=f"truncated:{truncated}",
        playbook=ESCALATION_PLAYBOOK, phase="fire", alertname="TruncatedAlerts",
        labels={"receiver": printable(payload.get("receiver", ""), 128)},
        annotations={"groupKey": group[:1024], "truncatedAlerts": str(truncated)},
        target_key="global", state="pending" if escalate else "done",
        decision=None if escalate else "truncated_escalated"))
    if new_id is None:
        return
    log.error("Alertmanager truncated %d alerts of group %r: they cannot be remediated",
              truncated, group[:200])
    tx.audit("truncated_escalated", intent_id=new_id, fingerprint=fingerprint,
                playbook=ESCALATION_PLAYBOOK, alertname="TruncatedAlerts",
                reason=f"{truncated} alerts truncated by Alertmanager; "
                       + ("paging" if escalate else "no pager_url configured, logged + metric"),
                detail={"groupKey": group[:1024], "truncatedAlerts": truncated})
    result.intents.append(new_id)
