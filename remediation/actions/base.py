"""The action interface the engine calls, and what every action's run step gets.

An action is one module with one `Action` object (registered in
trainwatch.remediation.actions.registry). The engine calls it in this order and never by name:

1. `check` (before anything is decided): refuse a target that can never be acted on
   (LabelError: refused, audited, never retried).
2. `plan` (outside any transaction, for a firing intent): what the action would do and on
   what evidence, as a typed `Plan`; None when the action needs none. It may raise
   `EvidencePending` (decide later, no attempt counted), LabelError (refuse) or ActionError
   (retry after backoff).
3. `rails` (inside the engine's decision transaction, so replicas are serialised): a `Verdict`
   that ends or holds the intent, or None to go on to the engine's own rails and the grant.
4. `granted` (same transaction, with the engine's grant): what the action records of it,
   and a page if the grant needs one.
5. `run` (each step): the effect, read back; ActionError when it was not achieved.
6. `after_playbook` (after the last step): clean up what a step set up for the playbook's
   duration (a silence).
7. When a step or the plan failed (ActionError, or a crash): `retry_delay` says how long until
   the next try, or None to give up (default: `retry_backoff` times the attempts, up to
   `max_attempts`; an ActionError whose `terminal` is set is never retried), and `gave_up`
   returns the page a failure for good needs, if any.

`outlives_resolve`: an intent held for approval by this action's rails stays held when its
alert resolves (a resolved alert does not mean the fault is gone), until it is decided or its
hold expires (`Verdict.hold_seconds`, with a page).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import requests

from trainwatch.remediation.config import Config
from trainwatch.remediation.decisions import Decision
from trainwatch.remediation.pager import Page

if TYPE_CHECKING:
    from trainwatch.remediation.store import Intent, Store, Transaction


class ActionError(RuntimeError):
    """The step did not achieve its effect; the message goes into the audit record. A
    `terminal` one is never retried."""

    terminal: ClassVar[bool] = False


class EvidencePending(Exception):
    """What the plan needs is still being gathered: decide once it is in (the engine looks
    again soon; no attempt is counted)."""


class Plan:
    """What an action decided to do about one intent before any step runs, and on what
    evidence; `as_dict` is what the audit, the pages and the step's result show of it."""

    intent_id: int

    def as_dict(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class Verdict:
    """What an action's rails decided instead of the grant: the audited decision, the intent's
    state after it, the reason, the detail, the rails that tripped (an approval overrides
    exactly these, re-checked when it is used), a page, and for a hold that outlives its alert,
    how long it is held before it expires."""

    decision: Decision
    state: str
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)
    rails: tuple[str, ...] = ()
    page: Page | None = None
    hold_seconds: float | None = None


@dataclass(frozen=True)
class RailsContext:
    """What the rails know besides the plan: whether a person approved the intent and which
    rails that approval overrode (the rails the hold named), whether the playbook only
    observes, the decision's time."""

    approved: bool
    approved_rails: frozenset[str]
    observe_only: bool
    now: float
    alertname: str = ""


class Action:
    """The default of every step of the interface: nothing to check, plan, hold, record or
    clean up. An action overrides what it needs; `run` it must."""

    name: ClassVar[str]
    outlives_resolve: ClassVar[bool] = False
    # True: an intent of this action that failed for good is tried again when the same alert
    # arrives again (its failure was the environment's, e.g. a scheduler away past the
    # deadline), instead of the redelivery being deduplicated away.
    retries_when_fired_again: ClassVar[bool] = False
    # The JSON schema of this action's step (`{"action": {"const": name}, ...}`), added to
    # the playbook schema's steps; None for the steps schemas/playbook.schema.json describes.
    step_schema: ClassVar[dict[str, Any] | None] = None

    def check(self, step: dict[str, Any], labels: Mapping[str, str], config: Config) -> None:
        return None

    def plan(self, intent: Intent, steps: tuple[dict[str, Any], ...], config: Config,
             store: Store) -> Plan | None:
        """`steps`: the playbook's steps of this action."""
        return None

    def rails(self, tx: Transaction, plan: Plan, config: Config,
              context: RailsContext) -> Verdict | None:
        return None

    def granted(self, tx: Transaction, plan: Plan, config: Config,
                context: RailsContext) -> Page | None:
        return None

    def run(self, step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        raise NotImplementedError

    def after_playbook(self, result: Mapping[str, Any], ctx: ActionContext) -> None:
        return None

    def retry_delay(self, config: Config, attempts: int) -> float | None:
        """Seconds until the next try after this action failed `attempts` times, or None: give
        up."""
        if attempts >= config.max_attempts:
            return None
        return config.retry_backoff_seconds * attempts

    def gave_up(self, intent: Intent, attempts: int, message: str,
                config: Config) -> Page | None:
        """The page an intent that failed for good in this action needs (None: the audit and
        the log say it)."""
        return None


@dataclass
class ActionContext:
    config: Config
    labels: dict[str, str]  # only allowlisted values (trainwatch.remediation.labels.safe_labels)
    idempotency_key: str  # stable across retries and restarts of the same step
    session: requests.Session
    dry_run: bool = False
    plan: Plan | None = None  # this step's action's plan (Action.plan), if it made one

    @property
    def template_config(self) -> dict[str, str | None]:
        return {"pager_url": self.config.pager_url,
                "alertmanager_url": self.config.alertmanager_url,
                "prometheus_url": self.config.prometheus_url}

    def command_id(self) -> str:
        """A short id derived from the idempotency key, usable in URLs and as a command id."""
        return hashlib.sha256(self.idempotency_key.encode()).hexdigest()[:32]


def timeout_of(step: dict[str, Any], default: float) -> float:
    from trainwatch.remediation.durations import seconds

    return seconds(step["timeout"]) if "timeout" in step else default
