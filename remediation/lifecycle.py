"""The intent lifecycle: every step an intent takes, each recorded in one place.

Intake, the engine, the approval API and the worker move intents only through the functions
here, inside the caller's store transaction (trainwatch.remediation.store.Transaction: the store
owns the
SQL, this module owns which state follows which and what the audit says about it):

    received  (intake: `receive`)  -> pending, or finished at once: done (invalid, unmatched,
              resolved_recorded, truncated_escalated) or refused; a resolve `cancel_unstarted`
              its firing intent when that has not started
    pending   -> running: claimed with a lease (Store.claim, the worker); every later write
              checks the lease first (`hold`, `advance`, `complete`, `fail`: LostLease)
    running   -> decided (the engine): `grant` (act: steps run), `resolve_act` (on_resolve
              runs), `defer` (a resolve waiting for its running firing intent: pending
              again), or `finish` with a terminal decision (refused, dry_run, cooled_down,
              rate_limited, a quarantine rail's) or awaiting_approval
    awaiting_approval -> pending (`approve`), rejected (`reject`), or cancelled (resolved);
              a hold that outlives its alert (`hold_for_approval`: an action's
              `outlives_resolve`) is not cancelled by the resolve; it ends approved, rejected
              or expired (`expire_holds`)
    act       -> step by step (`advance`) -> done (`complete`, audited acted), pending again
              (`fail`, a retry after backoff), failed (`fail`, given up), or cancelled (the
              alert resolved: `cancel_if_resolved`, checked at every step boundary)
    failed    -> pending (`retry_failed`: a scheduler intent's alert delivered again, still
              firing)

Why one module: the same transition (a cancel on resolve, a lease check) was written in
ingest, the engine and the app, each with its own SQL and audit text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainwatch.remediation.decisions import Decision
from trainwatch.remediation.store import Intent, NewIntent, Seen, Transaction


class LostLease(RuntimeError):
    """Another process took this intent over (our lease expired): stop touching it."""


def ids(intent: Intent) -> dict[str, Any]:
    """The audit row's references to an intent."""
    return {"intent_id": intent.id, "fingerprint": intent.fingerprint,
            "playbook": intent.playbook, "alertname": intent.alertname,
            "target_key": intent.target_key}


# --- received (intake) ---------------------------------------------------------------------
def receive(tx: Transaction, new: NewIntent, decision: str | None = None,
            **audit: Any) -> int | None:
    """Record a received intent unless its idempotency key exists (None then). With
    `decision`, the intent was decided at intake and the decision is audited on it (`audit`:
    the audit row's other fields)."""
    new_id = tx.insert_intent(new)
    if new_id is not None and decision is not None:
        tx.audit(decision, intent_id=new_id, **audit)
    return new_id


def retry_failed(tx: Transaction, fire: Intent | None, now: float) -> bool:
    """The alert of a firing intent that failed for good is delivered again, still firing:
    pending again with a fresh attempt budget (where it stopped: undecided, or at its
    unfinished step), audited `retried`. False when `fire` did not fail."""
    if fire is None or fire.phase != "fire" or fire.state != "failed":
        return False
    tx.update_intent(fire.id, state="pending", attempts=0, lease_owner=None, lease_until=None,
                     not_before=now)
    tx.audit(Decision.RETRIED, **ids(fire), reason="the alert is still firing after this intent "
             f"failed: tried again from step {fire.next_step + 1}",
             detail={"decision": fire.decision, "next_step": fire.next_step})
    return True


def duplicate(tx: Transaction, new: NewIntent, reason: str) -> None:
    """A redelivery of an intent already recorded: audited on that intent."""
    tx.audit_duplicate(new, reason)


def cancel_unstarted(tx: Transaction, fire: Intent | None) -> None:
    """The alert resolved: its firing intent's steps that are not running now never will.
    A running intent is left to stop itself at its next step boundary; a hold that outlives
    its alert stays."""
    if fire is None or fire.state not in ("pending", "awaiting_approval") or fire.hold_until:
        return
    tx.update_intent(fire.id, state="cancelled", decision="cancelled", lease_owner=None,
                     lease_until=None)
    tx.audit("cancelled", **ids(fire),
             reason=f"alert resolved while {fire.state}: steps from {fire.next_step + 1} on "
                    "were not run",
             detail={"acted": fire.acted, "next_step": fire.next_step})


# --- running (the engine, under the worker's lease) ----------------------------------------
def hold(tx: Transaction, intent: Intent, owner: str) -> Seen:
    """The intent as it is now, if `owner` still holds the lease of the claim that returned
    `intent`; LostLease otherwise (another worker's claim bumped the fencing token)."""
    seen = tx.look(intent.id)
    if seen is None or not seen.held_by(owner, intent.lease_gen):
        raise LostLease(intent.id)
    return seen


def cancel_if_resolved(tx: Transaction, seen: Seen, next_step: int,
                       results: list[dict[str, Any]] | None = None) -> bool:
    """If the alert of this firing intent has resolved, mark the intent cancelled (steps from
    `next_step` on never run) and audit it. An intent held past its alert's resolve goes on."""
    intent = seen.intent
    if intent.phase != "fire" or not seen.resolved or intent.hold_until:
        return False
    kept = results if results is not None else intent.results
    tx.update_intent(intent.id, state="cancelled", decision="cancelled", lease_owner=None,
                     lease_until=None, next_step=next_step, results=kept)
    tx.audit("cancelled", reason=f"alert resolved: steps from {next_step + 1} on were not run",
             detail={"acted": intent.acted, "next_step": next_step,
                     "results": results or intent.results}, **ids(intent))
    return True


def finish(tx: Transaction, intent: Intent, decision: str, state: str, reason: str,
           detail: Any = None) -> str:
    """A decision that ends the intent's run (or parks it awaiting approval), audited."""
    tx.update_intent(intent.id, state=state, decision=decision, lease_owner=None,
                     lease_until=None)
    tx.audit(decision, reason=reason, detail=detail, **ids(intent))
    return decision


def hold_for_approval(tx: Transaction, intent: Intent, reason: str, detail: Any,
                      until: float) -> str:
    """Awaiting approval until `until`, whatever the alert does meanwhile: its resolve does
    not cancel it (nor its steps once approved); `expire_holds` ends it at `until`."""
    tx.update_intent(intent.id, state="awaiting_approval",
                     decision=Decision.AWAITING_APPROVAL, lease_owner=None, lease_until=None,
                     hold_until=until)
    tx.audit(Decision.AWAITING_APPROVAL, reason=reason, detail=detail, **ids(intent))
    return Decision.AWAITING_APPROVAL


def expire_holds(tx: Transaction, now: float) -> list[Intent]:
    """Holds nobody decided before their `hold_until`: cancelled, audited `expired`; the
    caller pages for each."""
    expired = tx.expire_holds(now)
    for intent in expired:
        tx.audit(Decision.EXPIRED, reason="held for approval and not decided in time: nothing "
                 "was done; the fault may still be there", detail={"hold_until":
                                                                   intent.hold_until},
                 **ids(intent))
    return expired


def defer(tx: Transaction, intent: Intent, not_before: float) -> str:
    """Pending again, looked at from `not_before` on (a resolve whose firing intent runs)."""
    tx.update_intent(intent.id, state="pending", lease_owner=None, lease_until=None,
                     not_before=not_before)
    return "deferred"


def wait_for_evidence(tx: Transaction, intent: Intent, owner: str, not_before: float) -> None:
    """Pending again from `not_before`, undecided and without counting an attempt (a
    quarantine whose diagnostics record may still come); LostLease when the lease is gone."""
    if not tx.update_held(intent, owner, state="pending", lease_owner=None, lease_until=None,
                          not_before=not_before):
        raise LostLease(intent.id)


@dataclass(frozen=True)
class Grant:
    """One grant row: what the cooldowns, rate limits and breakers count."""

    playbook: str
    target_key: str
    priority: int


def grant(tx: Transaction, intent: Intent, grants: list[Grant], now: float) -> str:
    """Permission to act: the grants recorded, the intent's steps may run."""
    for row in grants:
        tx.add_grant(now, row.playbook, row.target_key, intent.id, row.priority)
    tx.update_intent(intent.id, decision="act", acted=1)
    return "act"


def resolve_act(tx: Transaction, intent: Intent) -> str:
    """The resolve's on_resolve steps may run (a firing step was started)."""
    tx.update_intent(intent.id, decision="resolve_act")
    return "resolve_act"


def advance(tx: Transaction, intent: Intent, owner: str, next_step: int,
            results: list[dict[str, Any]]) -> bool:
    """A step is done: record the progress (one statement while the lease holds and the alert
    has not resolved). False when the alert resolved and the intent was cancelled instead;
    LostLease when the lease is gone."""
    firing = intent.phase == "fire" and not intent.hold_until
    if tx.update_held(intent, owner, unless_resolved=firing, next_step=next_step,
                      results=results):
        return True
    if cancel_if_resolved(tx, hold(tx, intent, owner), next_step, results):
        return False
    tx.update_intent(intent.id, next_step=next_step, results=results)  # not reached: held
    return True


def complete(tx: Transaction, intent: Intent, owner: str, steps: list[dict[str, Any]],
             results: list[dict[str, Any]], reason: str) -> None:
    """Every step ran: done, audited `acted` (LostLease when the lease is gone)."""
    if not tx.update_held(intent, owner, state="done", lease_owner=None, lease_until=None,
                          next_step=len(steps), results=results):
        raise LostLease(intent.id)
    tx.audit("acted", **ids(intent), action=",".join(s["action"] for s in steps),
             reason=reason, detail={"results": results})


def fail(tx: Transaction, intent: Intent, owner: str, *, action: str, message: str,
         attempts: int, give_up: bool, not_before: float,
         results: list[dict[str, Any]] | None) -> bool:
    """A step or the run failed: pending again from `not_before` (a retry), or failed for
    good (`give_up`, audited). No retry of a firing step once its alert resolved: cancelled
    instead (returns False). LostLease when the lease is gone."""
    if give_up:
        if not tx.update_held(intent, owner, state="failed", attempts=attempts,
                              lease_owner=None, lease_until=None):
            raise LostLease(intent.id)
        tx.audit("failed", **ids(intent), action=action, reason=message[:4000],
                 detail={"attempts": attempts, "results": results or []})
        return True
    retry = {"state": "pending", "attempts": attempts, "lease_owner": None, "lease_until": None,
             "not_before": not_before}
    firing = intent.phase == "fire" and not intent.hold_until
    if tx.update_held(intent, owner, unless_resolved=firing, **retry):
        return True
    failed_step = len(results) if results is not None else intent.next_step
    if cancel_if_resolved(tx, hold(tx, intent, owner), failed_step, results):
        return False
    tx.update_intent(intent.id, **retry)  # not reached: held and not resolved
    return True


# --- awaiting approval (the approval API) --------------------------------------------------
@dataclass(frozen=True)
class Approval:
    """An approver's answer as recorded: the outcome ('approved', 'rejected', or why nothing
    was recorded: 'missing', 'not_awaiting', 'cancelled'), the intent's state before, and the
    rails the approval overrides (those the hold named; the rails are checked again when the
    approval is used, and any other that tripped since holds it again)."""

    outcome: str
    state: str | None
    overrides: tuple[str, ...] = ()


def approved_rails(tx: Transaction, intent_id: int) -> frozenset[str]:
    """The rails the intent's newest approval overrode."""
    detail = tx.latest_audit_detail(intent_id, Decision.APPROVED) or {}
    return frozenset(str(r) for r in detail.get("overrides", ()))


def approve(tx: Transaction, intent_id: int, who: str, *, approved: bool) -> Approval:
    """An approver's answer to an intent awaiting approval: approved (pending again, decided
    with the approval next), rejected, or nothing recorded: missing, not awaiting (the state
    says what it is), cancelled (approved, but the alert resolved: cancelled instead)."""
    seen = tx.look(intent_id)
    if seen is None:
        return Approval("missing", None)
    intent = seen.intent
    if intent.state != "awaiting_approval":
        return Approval("not_awaiting", intent.state)
    if approved and cancel_if_resolved(tx, seen, intent.next_step):
        return Approval("cancelled", intent.state)
    held = tx.latest_audit_detail(intent_id, Decision.AWAITING_APPROVAL) or {}
    overrides = tuple(str(r) for r in held.get("rails", ()))
    if approved:
        tx.update_intent(intent_id, state="pending", decision=None, approved=1)
    else:
        tx.update_intent(intent_id, state="rejected", decision=Decision.REJECTED)
    outcome = Decision.APPROVED if approved else Decision.REJECTED
    reason = f"{outcome} by {who}" + (f", overriding {', '.join(overrides)}"
                                      if approved and overrides else "")
    tx.audit(outcome, reason=reason, detail={"approver": who, "overrides": list(overrides)},
             **ids(intent))
    return Approval(str(outcome), intent.state, overrides)
