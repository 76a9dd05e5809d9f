"""Decide and act on one claimed intent.

Decision (once per intent, inside one BEGIN IMMEDIATE transaction, so two processes cannot
both pass a cooldown): labels allowlisted -> still firing -> dry-run -> approval gate ->
per-target cooldown and rate limit -> circuit breaker of the playbook's priority -> grant.
Then steps run one by one; after each the step index is committed, so a crash resumes at the
first unfinished step (and that step, being idempotent, is safe to repeat).

Resolve races: the alert's state is re-read at every moment something would act. Before a
firing intent's decision, before a resumed or retried step and at every step boundary, a
recorded resolve of the same alert cancels the steps not yet run (audited `cancelled`). The
resolve intent waits while its firing intent is running, then runs `on_resolve` once if any
firing step was started (`acted`), whatever the order the two arrived and ran in.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import requests

from remediation.actions import quarantine as quarantine_action
from remediation.actions import silence as silence_action
from remediation.actions.base import ActionContext, ActionError
from remediation.actions.registry import ACTIONS, check_targets
from remediation.config import Config
from remediation.ingest import ESCALATION_PLAYBOOK
from remediation.labels import LabelError, safe_labels
from remediation.playbooks import Playbook
from remediation.recovery import RecoveryTimes
from remediation.schedulers.base import SchedulerError
from remediation.store import PRIORITIES, Intent, Store

log = logging.getLogger(__name__)


class LostLease(RuntimeError):
    """Another process took this intent over (our lease expired): stop touching it."""


def _ids(intent: Intent) -> dict[str, Any]:
    return {"intent_id": intent.id, "fingerprint": intent.fingerprint,
            "playbook": intent.playbook, "alertname": intent.alertname,
            "target_key": intent.target_key}


def cancel_if_resolved(conn: Any, intent: Intent, next_step: int,
                       results: list[dict[str, Any]] | None = None) -> bool:
    """Inside the caller's transaction: if the alert of this firing intent has resolved, mark
    the intent cancelled (steps from `next_step` on never run) and audit it."""
    if intent.phase != "fire" or Store.partner(conn, intent.fingerprint, intent.starts_at,
                                               intent.playbook, "resolve") is None:
        return False
    acted = bool(conn.execute("SELECT acted FROM intents WHERE id=?", (intent.id,)).fetchone()[0])
    Store.update_intent(conn, intent.id, state="cancelled", decision="cancelled",
                        lease_owner=None, lease_until=None, next_step=next_step,
                        results=results if results is not None else intent.results)
    Store.audit(conn, "cancelled", reason=f"alert resolved: steps from {next_step + 1} on "
                f"were not run", detail={"acted": acted, "next_step": next_step,
                                         "results": results or intent.results}, **_ids(intent))
    return True


def escalation_playbook() -> Playbook:
    """Built in: page a human when Alertmanager truncated alerts from a notification."""
    return Playbook(
        name=ESCALATION_PLAYBOOK, alertnames=frozenset({"TruncatedAlerts"}), matchers=(),
        target=(), steps=({"action": "http", "url": "${config.pager_url}", "json": {
            "event": "truncated_alerts",
            "summary": "Alertmanager truncated alerts from a remediation notification: they "
                       "were not remediated; see GET /v1/actions?decision=truncated_escalated"}},))


class Engine:
    def __init__(self, config: Config, store: Store, books: Mapping[str, Playbook],
                 owner: str) -> None:
        self.config = config
        self.store = store
        self.books = {**books, ESCALATION_PLAYBOOK: escalation_playbook()}
        self.owner = owner
        self.session = requests.Session()
        # what self-healing saved (remediation/recovery.py); the server wires it in
        self.recovery: RecoveryTimes | None = None
        # how soon a resolve waiting for a running firing intent looks again
        self._recheck = min(max(config.poll_interval_seconds * 5, 0.25), 2.0)

    # --- decision -------------------------------------------------------------------------
    def _decide(self, intent: Intent, book: Playbook, labels_ok: bool, reason: str,
                plan: quarantine_action.Plan | None = None) -> str:
        """Returns 'act', 'resolve_act', 'deferred', or a terminal decision already written to
        the audit. With a quarantine `plan`, its rails run here, in the same transaction."""
        ids = _ids(intent)
        now = time.time()
        with self.store.transaction() as conn:
            if not Store.owns(conn, intent, self.owner):
                raise LostLease(intent.id)

            def finish(decision: str, state: str, why: str, detail: Any = None) -> str:
                Store.update_intent(conn, intent.id, state=state, decision=decision,
                                    lease_owner=None, lease_until=None)
                Store.audit(conn, decision, reason=why, detail=detail, **ids)
                return decision

            if not labels_ok:
                return finish("refused", "refused", reason)
            if intent.phase == "resolve":
                return self._decide_resolve(conn, intent, finish)
            if cancel_if_resolved(conn, intent, intent.next_step):
                return "cancelled"
            if self.config.dry_run or book.dry_run:
                return finish("dry_run", "done", "dry-run: steps planned, not executed",
                              {"steps": list(book.steps)})
            if book.requires_approval and not intent.approved:
                return finish("awaiting_approval", "awaiting_approval",
                              "playbook requires approval (POST /v1/actions/<id>/approve)")
            if plan is not None:
                assert self.config.scheduler is not None  # plan_for refuses without one
                verdict = quarantine_action.decide(
                    conn, plan, approved=intent.approved, observe_only=book.observe_only,
                    settings=self.config.scheduler, now=now)
                if verdict is not None:
                    return finish(*verdict)
            key = intent.target_key or ""
            if book.cooldown_seconds > 0:
                _, last = Store.grants_since(conn, now - book.cooldown_seconds, book.name, key)
                if last is not None:
                    return finish("cooled_down", "done",
                                  f"acted on {key} {now - last:.0f}s ago; cooldown "
                                  f"{book.cooldown_seconds:.0f}s")
            if book.rate_limit_count is not None:
                count, _ = Store.grants_since(conn, now - book.rate_limit_window_seconds,
                                              book.name, key)
                if count >= book.rate_limit_count:
                    return finish("rate_limited", "done",
                                  f"{count} actions on {key} in the last "
                                  f"{book.rate_limit_window_seconds:.0f}s (limit "
                                  f"{book.rate_limit_count})")
            priority = PRIORITIES[book.priority]
            if intent.playbook != ESCALATION_PLAYBOOK:
                total, _ = Store.grants_since(conn, now - self.config.breaker_window_seconds,
                                              min_priority=priority)
                limit = self.config.breaker_limit(book.priority)
                if total >= limit:
                    return finish("refused", "refused",
                                  f"circuit breaker open ({book.priority} priority): {total} "
                                  f"actions at this priority or above in the last "
                                  f"{self.config.breaker_window_seconds:.0f}s (limit {limit})")
            conn.execute("INSERT INTO grants (at, playbook, target_key, intent_id, priority)"
                         " VALUES (?,?,?,?,?)", (now, book.name, key, intent.id, priority))
            if plan is not None:
                quarantine_action.record_grant(conn, plan, now)
            Store.update_intent(conn, intent.id, decision="act", acted=1)
        return "act"

    def _decide_resolve(self, conn: Any, intent: Intent, finish: Any) -> str:
        """on_resolve runs once, after the firing steps that ran have stopped, and only if
        one was started."""
        fire = Store.partner(conn, intent.fingerprint, intent.starts_at, intent.playbook, "fire")
        if fire is not None and fire["state"] == "running":
            # Its worker cancels the remaining steps at the next boundary; look again soon.
            Store.update_intent(conn, intent.id, state="pending", lease_owner=None,
                                lease_until=None, not_before=time.time() + self._recheck)
            return "deferred"
        if fire is not None and fire["state"] in ("pending", "awaiting_approval"):
            from remediation.ingest import cancel_unstarted_fire

            cancel_unstarted_fire(conn, intent.fingerprint, intent.starts_at, intent.playbook)
        if fire is None or not fire["acted"]:
            return finish("resolved_recorded", "done",
                          "resolved; the firing alert was never acted on, nothing to undo")
        Store.update_intent(conn, intent.id, decision="resolve_act")
        return "resolve_act"

    # --- execution ------------------------------------------------------------------------
    def process(self, intent: Intent) -> None:
        book = self.books.get(intent.playbook)
        if book is None:
            self._fail(intent, "", f"playbook {intent.playbook!r} is no longer loaded",
                       terminal=True)
            return
        try:
            labels = safe_labels(intent.labels, sorted(book.used_labels))
            if intent.decision not in ("act", "resolve_act"):  # not yet decided
                check_targets([*book.steps, *book.on_resolve], labels, self.config)
            labels_ok, reason = True, ""
        except LabelError as exc:
            labels, labels_ok, reason = {}, False, str(exc)
        plan = None
        if labels_ok and intent.phase == "fire" and any(
                step["action"] == "quarantine" for step in book.steps):
            try:  # classify and resolve the node before anything is decided (issue 23)
                plan = quarantine_action.plan_for(intent.id, intent.labels, self.config)
            except LabelError as exc:
                labels_ok, reason = False, str(exc)
            except SchedulerError as exc:
                self._fail(intent, "quarantine", str(exc), terminal=False)
                return
        decision = intent.decision
        if decision in ("act", "resolve_act"):  # resumed: a retry or a dead process's work
            with self.store.transaction() as conn:
                if not Store.owns(conn, intent, self.owner):
                    raise LostLease(intent.id)
                if cancel_if_resolved(conn, intent, intent.next_step):
                    return
        else:
            decision = self._decide(intent, book, labels_ok, reason, plan)
            if plan is not None and decision in ("observe_only", "awaiting_approval"):
                last = self.store.list_audit(1, intent.id)
                quarantine_action.page(self.session, self.config, decision,
                                       last[0]["reason"] if last else decision, plan,
                                       intent.labels)
        if decision not in ("act", "resolve_act"):
            return
        steps = book.on_resolve if decision == "resolve_act" else book.steps
        ctx = ActionContext(config=self.config, labels=labels, session=self.session,
                            idempotency_key=intent.idempotency_key, plan=plan)
        results = list(intent.results)
        for index in range(intent.next_step, len(steps)):
            step = steps[index]
            ctx.idempotency_key = f"{intent.idempotency_key}|step{index}"
            try:
                outcome = ACTIONS[step["action"]](step, ctx)
            except ActionError as exc:
                self._fail(intent, step["action"], str(exc), terminal=False, results=results)
                return
            except Exception as exc:
                log.exception("action %s crashed", step["action"])
                self._fail(intent, step["action"], f"{type(exc).__name__}: {exc}",
                           terminal=False, results=results)
                return
            results.append({"step": index, "action": step["action"], "result": outcome})
            if index == len(steps) - 1:
                break  # the last step's progress is committed with the completion below
            with self.store.transaction() as conn:
                if not Store.owns(conn, intent, self.owner):
                    raise LostLease(intent.id)
                if cancel_if_resolved(conn, intent, index + 1, results):
                    return
                Store.update_intent(conn, intent.id, next_step=index + 1, results=results)
        self._expire_silences(results, ctx)
        with self.store.transaction() as conn:
            if not Store.owns(conn, intent, self.owner):
                raise LostLease(intent.id)
            Store.update_intent(conn, intent.id, state="done", lease_owner=None, lease_until=None,
                                next_step=len(steps), results=results)
            Store.audit(conn, "acted", intent_id=intent.id, fingerprint=intent.fingerprint,
                        playbook=intent.playbook, alertname=intent.alertname,
                        target_key=intent.target_key,
                        action=",".join(s["action"] for s in steps),
                        reason="on_resolve steps completed" if decision == "resolve_act"
                        else "all steps completed", detail={"results": results})
        if decision == "act" and self.recovery is not None:
            self.recovery.observe_intent(self.session, self.config.prometheus_url, book.name,
                                         intent.alertname, intent.labels, intent.starts_at,
                                         time.time())

    def _expire_silences(self, results: list[dict[str, Any]], ctx: ActionContext) -> None:
        for item in results:
            res = item.get("result") or {}
            if item["action"] == "silence" and res.get("silence_id") and res.get(
                    "expire_after_playbook", True):
                silence_action.expire(res["silence_id"], ctx)

    def release_after_crash(self, intent: Intent, message: str) -> None:
        """An unexpected error outside a step: retry later (or fail for good), audited."""
        with contextlib.suppress(LostLease):
            self._fail(intent, "", message, terminal=False)

    def _fail(self, intent: Intent, action: str, message: str, *, terminal: bool,
              results: list[dict[str, Any]] | None = None) -> None:
        attempts = intent.attempts + 1
        give_up = terminal or attempts >= self.config.max_attempts
        with self.store.transaction() as conn:
            if not Store.owns(conn, intent, self.owner):
                raise LostLease(intent.id)
            failed_step = len(results) if results is not None else intent.next_step
            if not give_up and cancel_if_resolved(conn, intent, failed_step, results):
                return  # no retry of a firing step once the alert resolved
            if give_up:
                Store.update_intent(conn, intent.id, state="failed", attempts=attempts,
                                    lease_owner=None, lease_until=None)
                Store.audit(conn, "failed", intent_id=intent.id, fingerprint=intent.fingerprint,
                            playbook=intent.playbook, alertname=intent.alertname,
                            target_key=intent.target_key, action=action, reason=message[:4000],
                            detail={"attempts": attempts, "results": results or []})
            else:
                Store.update_intent(
                    conn, intent.id, state="pending", attempts=attempts, lease_owner=None,
                    lease_until=None,
                    not_before=time.time() + self.config.retry_backoff_seconds * attempts)
        if give_up:
            log.error("intent %d (%s) failed after %d attempts: %s", intent.id, intent.playbook,
                      attempts, message[:500])
        else:
            log.warning("intent %d (%s) attempt %d failed, will retry: %s", intent.id,
                        intent.playbook, attempts, message[:500])
