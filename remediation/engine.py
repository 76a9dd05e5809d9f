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

from trainwatch.remediation import lifecycle
from trainwatch.remediation.actions import quarantine as quarantine_action
from trainwatch.remediation.actions import silence as silence_action
from trainwatch.remediation.actions.base import ActionContext, ActionError
from trainwatch.remediation.actions.registry import ACTIONS, check_targets
from trainwatch.remediation.config import Config
from trainwatch.remediation.ingest import ESCALATION_PLAYBOOK
from trainwatch.remediation.labels import LabelError, safe_labels
from trainwatch.remediation.lifecycle import Grant, LostLease, cancel_if_resolved, hold
from trainwatch.remediation.playbooks import Playbook
from trainwatch.remediation.recovery import RecoveryTimes, unix_time
from trainwatch.remediation.schedulers.base import SchedulerError
from trainwatch.remediation.store import PRIORITIES, Intent, Store, Transaction

log = logging.getLogger(__name__)


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
        if config.tls_ca_file is not None:  # the control APIs' certificates, verified
            self.session.verify = str(config.tls_ca_file)
        # what self-healing saved (remediation/recovery.py); the server wires it in
        self.recovery: RecoveryTimes | None = None
        # how soon a resolve waiting for a running firing intent looks again
        self._recheck = min(max(config.poll_interval_seconds * 5, 0.25), 2.0)

    # --- decision -------------------------------------------------------------------------
    def _decide(self, intent: Intent, book: Playbook, labels_ok: bool, reason: str,
                plan: quarantine_action.Plan | None = None) -> str:
        """Returns 'act', 'resolve_act', 'deferred', or a terminal decision already written to
        the audit. With a quarantine `plan`, its rails run here, in the same transaction."""
        with self.store.transaction() as tx:
            now = tx.now  # the store's clock: grants and windows agree across replicas
            seen = hold(tx, intent, self.owner)

            def finish(decision: str, state: str, why: str, detail: Any = None) -> str:
                return lifecycle.finish(tx, intent, decision, state, why, detail)

            if not labels_ok:
                return finish("refused", "refused", reason)
            if intent.phase == "resolve":
                return self._decide_resolve(tx, intent, finish)
            if cancel_if_resolved(tx, seen, intent.next_step):
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
                    tx, plan, approved=intent.approved, observe_only=book.observe_only,
                    settings=self.config.scheduler, now=now)
                if verdict is not None:
                    return finish(*verdict)
            key = intent.target_key or ""
            priority = PRIORITIES[book.priority]
            breaker = intent.playbook != ESCALATION_PLAYBOOK
            grants = tx.grant_counts(
                book.name, key,
                cooldown_since=now - book.cooldown_seconds if book.cooldown_seconds > 0 else None,
                rate_since=(now - book.rate_limit_window_seconds
                            if book.rate_limit_count is not None else None),
                breaker_since=now - self.config.breaker_window_seconds if breaker else None,
                min_priority=priority)
            if grants.last is not None:
                return finish("cooled_down", "done",
                              f"acted on {key} {now - grants.last:.0f}s ago; cooldown "
                              f"{book.cooldown_seconds:.0f}s")
            if book.rate_limit_count is not None and \
                    grants.in_rate_window >= book.rate_limit_count:
                return finish("rate_limited", "done",
                              f"{grants.in_rate_window} actions on {key} in the last "
                              f"{book.rate_limit_window_seconds:.0f}s (limit "
                              f"{book.rate_limit_count})")
            limit = self.config.breaker_limit(book.priority)
            if breaker and grants.in_breaker_window >= limit:
                return finish("refused", "refused",
                              f"circuit breaker open ({book.priority} priority): "
                              f"{grants.in_breaker_window} actions at this priority or above "
                              f"in the last {self.config.breaker_window_seconds:.0f}s "
                              f"(limit {limit})")
            if plan is not None:
                quarantine_action.record_grant(tx, plan, now)
            return lifecycle.grant(tx, intent, [Grant(book.name, key, priority)], now)

    def _decide_resolve(self, tx: Transaction, intent: Intent, finish: Any) -> str:
        """on_resolve runs once, after the firing steps that ran have stopped, and only if
        one was started."""
        fire = tx.partner(intent, "fire")
        if fire is not None and fire.state == "running":
            # Its worker cancels the remaining steps at the next boundary; look again soon.
            return lifecycle.defer(tx, intent, time.time() + self._recheck)
        lifecycle.cancel_unstarted(tx, fire)
        if fire is None or not fire.acted:
            return finish("resolved_recorded", "done",
                          "resolved; the firing alert was never acted on, nothing to undo")
        return lifecycle.resolve_act(tx, intent)

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
                diagnostics = None
                if quarantine_action.needs_diagnostics(intent.labels, self.config):
                    diagnostics = self._diagnostics(intent)
                plan = quarantine_action.plan_for(intent.id, intent.labels, self.config,
                                                  diagnostics)
            except quarantine_action.EvidencePending as exc:
                self._defer(intent, str(exc))
                return
            except LabelError as exc:
                labels_ok, reason = False, str(exc)
            except SchedulerError as exc:
                self._fail(intent, "quarantine", str(exc), terminal=False)
                return
        decision = intent.decision
        if decision in ("act", "resolve_act"):  # resumed: a retry or a dead process's work
            with self.store.transaction() as tx:
                if cancel_if_resolved(tx, hold(tx, intent, self.owner), intent.next_step):
                    return
        else:
            decision = self._decide(intent, book, labels_ok, reason, plan)
            if plan is not None and decision in quarantine_action.PAGED_DECISIONS:
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
                self._fail(intent, step["action"], str(exc),
                           terminal=getattr(exc, "terminal", False), results=results)
                return
            except Exception as exc:
                log.exception("action %s crashed", step["action"])
                self._fail(intent, step["action"], f"{type(exc).__name__}: {exc}",
                           terminal=False, results=results)
                return
            results.append({"step": index, "action": step["action"], "result": outcome})
            if index == len(steps) - 1:
                break  # the last step's progress is committed with the completion below
            with self.store.transaction() as tx:
                if not lifecycle.advance(tx, intent, self.owner, index + 1, results):
                    return
        self._expire_silences(results, ctx)
        with self.store.transaction() as tx:
            lifecycle.complete(tx, intent, self.owner, list(steps), results,
                               "on_resolve steps completed" if decision == "resolve_act"
                               else "all steps completed")
        if decision == "act" and self.recovery is not None:
            self.recovery.observe_intent(self.session, self.config.prometheus_url, book.name,
                                         intent.alertname, intent.labels, intent.starts_at,
                                         time.time())

    def _diagnostics(self, intent: Intent) -> quarantine_action.Diagnostics:
        """The stall's diagnostics record, from the job's stalled_job_diagnostics intent
        (this alert's, or another alert's of the same stall: that playbook runs once per job
        and cooldown). EvidencePending while it may still act: the record decides which node
        is suspect, so the quarantine waits for it, up to two action timeouts and a minute
        after the alert started; past that, or without one, the alert's own rank is."""
        key = quarantine_action.diagnostics_target(intent.labels)
        if key is None:
            return quarantine_action.Diagnostics(note="no training_job label to find the "
                                                 "diagnostics by")
        now = time.time()
        started = unix_time(intent.starts_at) or now
        with self.store.transaction() as tx:
            rows = tx.recent_firing_intents(
                quarantine_action.DIAGNOSTICS_PLAYBOOK, key,
                started - quarantine_action.DIAGNOSTICS_CLOCK_SLACK_SECONDS)
        return quarantine_action.find_diagnostics(
            rows, waited=now - started,
            wait_limit=2 * self.config.action_timeout_seconds + 60)

    def _defer(self, intent: Intent, why: str) -> None:
        """Look at this intent again soon, undecided and without counting an attempt."""
        with self.store.transaction() as tx:
            lifecycle.wait_for_evidence(tx, intent, self.owner, time.time() + self._recheck)
        log.debug("intent %d (%s) waits: %s", intent.id, intent.playbook, why)

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
        if action == "quarantine" and self.config.scheduler is not None:
            # the scheduler may be away (a slurmctld restart): keep trying until its deadline
            delay = quarantine_action.retry_delay(self.config, attempts)
        else:
            delay = (None if attempts >= self.config.max_attempts
                     else self.config.retry_backoff_seconds * attempts)
        give_up = terminal or delay is None
        with self.store.transaction() as tx:
            if not lifecycle.fail(
                    tx, intent, self.owner, action=action, message=message, attempts=attempts,
                    give_up=give_up, results=results, not_before=time.time() + (delay or 0)):
                return  # no retry of a firing step once the alert resolved
        if give_up and action == "quarantine":
            quarantine_action.page_failure(self.session, self.config, intent, attempts, message)
        if give_up:
            log.error("intent %d (%s) failed after %d attempts: %s", intent.id, intent.playbook,
                      attempts, message[:500])
        else:
            log.warning("intent %d (%s) attempt %d failed, will retry: %s", intent.id,
                        intent.playbook, attempts, message[:500])
