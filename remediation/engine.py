"""Decide and act on one claimed intent.

Decision (once per intent, inside one BEGIN IMMEDIATE transaction, so two processes cannot
both pass a cooldown): labels allowlisted -> still firing -> dry-run -> approval gate ->
per-target cooldown and rate limit -> circuit breaker of the playbook's priority -> grant.
A playbook whose cooldown ends on the job's progress (`cooldown_ends_on: job_progress`, the
stall playbooks) is cooled down only by the same event (trainwatch.remediation.progress).
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
from pathlib import Path
from typing import Any

import requests

from trainwatch.remediation import lifecycle
from trainwatch.remediation.actions.base import (
    Action,
    ActionContext,
    ActionError,
    EvidencePending,
    Plan,
    RailsContext,
    Verdict,
    timeout_of,
)
from trainwatch.remediation.actions.registry import ACTIONS, check_targets
from trainwatch.remediation.config import Config
from trainwatch.remediation.decisions import RUNS_STEPS, Decision
from trainwatch.remediation.ingest import ESCALATION_PLAYBOOK, escalation_playbook
from trainwatch.remediation.labels import LabelError, safe_labels
from trainwatch.remediation.lifecycle import Grant, LostLease, cancel_if_resolved, hold
from trainwatch.remediation.pager import Page, Pager
from trainwatch.remediation.playbooks import Playbook
from trainwatch.remediation.progress import Progress, read_progress, same_event, wants_progress
from trainwatch.remediation.recovery import RecoveryTimes
from trainwatch.remediation.store import PRIORITIES, Intent, Store, Transaction

log = logging.getLogger(__name__)
# The retry policy of a failure outside any action's step (no playbook, a crash)
DEFAULT_ACTION = Action()
# How long past its timeout a step may run before /readyz calls its worker stuck.
STUCK_GRACE_SECONDS = 60.0


class PinnedCaSession(requests.Session):
    """A session whose own `verify` (a CA file) holds against the environment.

    requests lets REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE replace a session's `verify` (only a
    `verify=` given to each call beats them), so a service started with either set (common
    where a proxy or a distribution sets its bundle) would check the training exporters'
    certificates against that bundle and fail every control API call: a command never sent."""

    def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any,
                                   cert: Any) -> dict[str, Any]:
        if verify is None and isinstance(self.verify, str):
            verify = self.verify
        return super().merge_environment_settings(url, proxies, stream, verify, cert)


def control_api_session(ca_file: Path | None) -> requests.Session:
    """The session actions reach the training exporters' control APIs with: verified against
    `ca_file` when TLS is configured (config tls_ca_file), whatever the environment says."""
    session = PinnedCaSession()
    if ca_file is not None:
        session.verify = str(ca_file)
    return session


class Engine:
    def __init__(self, config: Config, store: Store, books: Mapping[str, Playbook],
                 owner: str, pager: Pager | None = None) -> None:
        self.config = config
        self.store = store
        self.books = {**books, ESCALATION_PLAYBOOK: escalation_playbook()}
        self.owner = owner
        self.session = control_api_session(config.tls_ca_file)
        self.pager = pager or Pager(config.pager_url, config.request_timeout_seconds)
        # what self-healing saved (remediation/recovery.py); the server wires it in
        self.recovery: RecoveryTimes | None = None
        # how soon a resolve waiting for a running firing intent looks again
        self._recheck = min(max(config.poll_interval_seconds * 5, 0.25), 2.0)
        # monotonic time by which the running step should have ended (None: no step runs)
        self.step_deadline: float | None = None

    # --- planning -------------------------------------------------------------------------
    def _plans(self, intent: Intent, book: Playbook) -> dict[str, Plan]:
        """Each step action's plan (Action.plan), before anything is decided. Raises
        EvidencePending, LabelError, or ActionError as (action name, error)."""
        plans: dict[str, Plan] = {}
        for name in dict.fromkeys(step["action"] for step in book.steps):
            try:
                steps = tuple(step for step in book.steps if step["action"] == name)
                plan = ACTIONS[name].plan(intent, steps, self.config, self.store)
            except ActionError as exc:
                raise _PlanFailed(name, str(exc)) from exc
            if plan is not None:
                plans[name] = plan
        return plans

    # --- decision -------------------------------------------------------------------------
    def _progress(self, intent: Intent, book: Playbook,
                  labels: Mapping[str, str]) -> Progress | None:
        """The job's progress, read only where it can decide something: a playbook whose
        cooldown ends on it, on a target acted on inside that cooldown. A first alert is
        never held up by the query's timeout while the metrics store is away, and other
        playbooks pay no extra store read."""
        if not wants_progress(book, labels) or not self._acted_within_cooldown(intent, book):
            return None
        return read_progress(self.session, self.config.prometheus_url, book, labels)

    def _acted_within_cooldown(self, intent: Intent, book: Playbook) -> bool:
        """Whether the target has a grant inside the playbook's cooldown."""
        if book.cooldown_seconds <= 0:
            return False
        with self.store.transaction() as tx:
            grants = tx.grant_counts(book.name, intent.target_key or "",
                                     cooldown_since=tx.now - book.cooldown_seconds,
                                     rate_since=None, breaker_since=None,
                                     min_priority=PRIORITIES[book.priority])
        return grants.last is not None

    def _decide(self, intent: Intent, book: Playbook, labels_ok: bool, reason: str,
                plans: Mapping[str, Plan], progress: Progress | None = None) -> str:
        """Returns 'act', 'resolve_act', 'deferred', or a terminal decision already written to
        the audit. Each action's rails run here, in the same transaction; pages go out once
        it committed."""
        pages: list[Page] = []
        with self.store.transaction() as tx:
            decision = self._decide_in(tx, intent, book, labels_ok, reason, plans, pages,
                                       progress)
        for page in pages:
            self.pager.send(page)
        return decision

    def _decide_in(self, tx: Transaction, intent: Intent, book: Playbook, labels_ok: bool,
                   reason: str, plans: Mapping[str, Plan], pages: list[Page],
                   progress: Progress | None = None) -> str:
        now = tx.now  # the store's clock: grants and windows agree across replicas
        seen = hold(tx, intent, self.owner)

        def finish(decision: str, state: str, why: str, detail: Any = None) -> str:
            return lifecycle.finish(tx, intent, decision, state, why, detail)

        if not labels_ok:
            return finish(Decision.REFUSED, "refused", reason)
        if intent.phase == "resolve":
            return self._decide_resolve(tx, intent, finish)
        if cancel_if_resolved(tx, seen, intent.next_step):
            return Decision.CANCELLED
        if self.config.dry_run or book.dry_run:
            return finish(Decision.DRY_RUN, "done", "dry-run: steps planned, not executed",
                          {"steps": list(book.steps)})
        if book.requires_approval and not intent.approved:
            return finish(Decision.AWAITING_APPROVAL, "awaiting_approval",
                          "playbook requires approval (POST /v1/actions/<id>/approve)")
        context = RailsContext(
            approved=intent.approved,
            approved_rails=(lifecycle.approved_rails(tx, intent.id) if intent.approved
                            else frozenset()),
            observe_only=book.observe_only, now=now, alertname=intent.alertname)
        for name, plan in plans.items():
            verdict = ACTIONS[name].rails(tx, plan, self.config, context)
            if verdict is not None:
                return self._apply(tx, intent, verdict, pages, finish, now)
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
        same = (None if grants.last is None
                else same_event(book, intent.starts_at, grants.last, progress))
        if same is not None:
            assert grants.last is not None
            return finish(Decision.COOLED_DOWN, "done",
                          f"acted on {key} {now - grants.last:.0f}s ago; cooldown "
                          f"{book.cooldown_seconds:.0f}s" + (f"; {same}" if same else ""))
        if book.rate_limit_count is not None and \
                grants.in_rate_window >= book.rate_limit_count:
            return finish(Decision.RATE_LIMITED, "done",
                          f"{grants.in_rate_window} actions on {key} in the last "
                          f"{book.rate_limit_window_seconds:.0f}s (limit "
                          f"{book.rate_limit_count})")
        limit = self.config.breaker_limit(book.priority)
        if breaker and grants.in_breaker_window >= limit:
            return finish(Decision.REFUSED, "refused",
                          f"circuit breaker open ({book.priority} priority): "
                          f"{grants.in_breaker_window} actions at this priority or above "
                          f"in the last {self.config.breaker_window_seconds:.0f}s "
                          f"(limit {limit})")
        for name, plan in plans.items():
            page = ACTIONS[name].granted(tx, plan, self.config, context)
            if page is not None:
                pages.append(page)
        return lifecycle.grant(tx, intent, [Grant(book.name, key, priority)], now)

    @staticmethod
    def _apply(tx: Transaction, intent: Intent, verdict: Verdict, pages: list[Page],
               finish: Any, now: float) -> str:
        """An action's rails decided instead of the grant: audited, held or ended, paged."""
        if verdict.page is not None:
            pages.append(verdict.page)
        if verdict.state == "awaiting_approval" and verdict.hold_seconds is not None:
            return lifecycle.hold_for_approval(tx, intent, verdict.reason, verdict.detail,
                                               now + verdict.hold_seconds)
        return str(finish(verdict.decision, verdict.state, verdict.reason, verdict.detail))

    def _decide_resolve(self, tx: Transaction, intent: Intent, finish: Any) -> str:
        """on_resolve runs once, after the firing steps that ran have stopped, and only if
        one was started."""
        fire = tx.partner(intent, "fire")
        if fire is not None and fire.state == "running":
            # Its worker cancels the remaining steps at the next boundary; look again soon.
            return lifecycle.defer(tx, intent, time.time() + self._recheck)
        lifecycle.cancel_unstarted(tx, fire)
        if fire is None or not fire.acted:
            return finish(Decision.RESOLVED_RECORDED, "done",
                          "resolved; the firing alert was never acted on, nothing to undo")
        return lifecycle.resolve_act(tx, intent)

    def expire_holds(self) -> int:
        """End the approval holds nobody decided in time, with a page each."""
        with self.store.transaction() as tx:
            expired = lifecycle.expire_holds(tx, tx.now)
        for intent in expired:
            self.pager.send(Page(f"hold_{Decision.EXPIRED}", intent.id, intent.alertname,
                                 f"intent {intent.id} ({intent.playbook}) was held for "
                                 "approval and not decided in time: nothing was done, the "
                                 "fault may still be there", {"playbook": intent.playbook,
                                                              "labels": intent.labels}))
        return len(expired)

    # --- execution ------------------------------------------------------------------------
    def process(self, intent: Intent) -> None:
        book = self.books.get(intent.playbook)
        if book is None:
            self._fail(intent, "", f"playbook {intent.playbook!r} is no longer loaded",
                       terminal=True)
            return
        try:
            labels = safe_labels(intent.labels, sorted(book.used_labels))
            if intent.decision not in RUNS_STEPS:  # not yet decided
                check_targets([*book.steps, *book.on_resolve], labels, self.config)
            labels_ok, reason = True, ""
        except LabelError as exc:
            labels, labels_ok, reason = {}, False, str(exc)
        plans: dict[str, Plan] = {}
        if labels_ok and intent.phase == "fire":
            try:  # what each action would do, on what evidence, before anything is decided
                plans = self._plans(intent, book)
            except EvidencePending as exc:
                self._defer(intent, str(exc))
                return
            except LabelError as exc:
                labels_ok, reason = False, str(exc)
            except _PlanFailed as exc:
                self._fail(intent, exc.action, exc.message, terminal=False)
                return
        decision = intent.decision
        if decision in RUNS_STEPS:  # resumed: a retry or a dead process's work
            with self.store.transaction() as tx:
                if cancel_if_resolved(tx, hold(tx, intent, self.owner), intent.next_step):
                    return
        else:
            progress = self._progress(intent, book, labels) if labels_ok else None
            decision = self._decide(intent, book, labels_ok, reason, plans, progress)
        if decision not in RUNS_STEPS:
            return
        steps = book.on_resolve if decision == Decision.RESOLVE_ACT else book.steps
        ctx = ActionContext(config=self.config, labels=labels, session=self.session,
                            idempotency_key=intent.idempotency_key)
        results = list(intent.results)
        for index in range(intent.next_step, len(steps)):
            step = steps[index]
            ctx.idempotency_key = f"{intent.idempotency_key}|step{index}"
            ctx.plan = plans.get(step["action"])
            self.step_deadline = (time.monotonic() + STUCK_GRACE_SECONDS
                                  + timeout_of(step, self.config.action_timeout_seconds))
            try:
                outcome = ACTIONS[step["action"]].run(step, ctx)
            except ActionError as exc:
                self._fail(intent, step["action"], str(exc),
                           terminal=exc.terminal, results=results)
                return
            except Exception as exc:
                log.exception("action %s crashed", step["action"])
                self._fail(intent, step["action"], f"{type(exc).__name__}: {exc}",
                           terminal=False, results=results)
                return
            finally:
                self.step_deadline = None
            results.append({"step": index, "action": step["action"], "result": outcome})
            if index == len(steps) - 1:
                break  # the last step's progress is committed with the completion below
            with self.store.transaction() as tx:
                if not lifecycle.advance(tx, intent, self.owner, index + 1, results):
                    return
        for item in results:
            ACTIONS[item["action"]].after_playbook(item.get("result") or {}, ctx)
        with self.store.transaction() as tx:
            lifecycle.complete(tx, intent, self.owner, list(steps), results,
                               "on_resolve steps completed" if decision == Decision.RESOLVE_ACT
                               else "all steps completed")
        if decision == Decision.ACT and self.recovery is not None:
            self.recovery.observe_intent(self.session, self.config.prometheus_url, book.name,
                                         intent.alertname, intent.labels, intent.starts_at,
                                         time.time())

    def _defer(self, intent: Intent, why: str) -> None:
        """Look at this intent again soon, undecided and without counting an attempt."""
        with self.store.transaction() as tx:
            lifecycle.wait_for_evidence(tx, intent, self.owner, time.time() + self._recheck)
        log.debug("intent %d (%s) waits: %s", intent.id, intent.playbook, why)

    def release_after_crash(self, intent: Intent, message: str) -> None:
        """An unexpected error outside a step: retry later (or fail for good), audited."""
        with contextlib.suppress(LostLease):
            self._fail(intent, "", message, terminal=False)

    def _fail(self, intent: Intent, action: str, message: str, *, terminal: bool,
              results: list[dict[str, Any]] | None = None) -> None:
        attempts = intent.attempts + 1
        policy = ACTIONS.get(action, DEFAULT_ACTION)  # the action's retry policy
        delay = policy.retry_delay(self.config, attempts)
        give_up = terminal or delay is None
        with self.store.transaction() as tx:
            if not lifecycle.fail(
                    tx, intent, self.owner, action=action, message=message, attempts=attempts,
                    give_up=give_up, results=results, not_before=time.time() + (delay or 0)):
                return  # no retry of a firing step once the alert resolved
        if give_up:
            page = policy.gave_up(intent, attempts, message, self.config)
            if page is not None:
                self.pager.send(page)
            log.error("intent %d (%s) failed after %d attempts: %s", intent.id, intent.playbook,
                      attempts, message[:500])
        else:
            log.warning("intent %d (%s) attempt %d failed, will retry: %s", intent.id,
                        intent.playbook, attempts, message[:500])


class _PlanFailed(Exception):
    """An action's plan failed in a way a retry may fix (ActionError), with the action's
    name for the audit."""

    def __init__(self, action: str, message: str) -> None:
        super().__init__(message)
        self.action = action
        self.message = message
