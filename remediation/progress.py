"""When a stall is the same stall: the cooldown of a playbook whose cooldown ends on the
job's progress (`cooldown_ends_on: job_progress`, the stall playbooks; chaos soak bug 3 in
docs/performance.md). The engine reads the job's progress before its decision (outside the
transaction) and asks same_event inside it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainwatch.exporters.contract.catalog import LABEL_JOB
from trainwatch.remediation.actions.prometheus import PrometheusError, job_last_step
from trainwatch.remediation.playbooks import COOLDOWN_ENDS_ON_PROGRESS, Playbook
from trainwatch.remediation.recovery import unix_time


@dataclass(frozen=True)
class Progress:
    """When the intent's job last stepped (Unix time; None: no exporter serves a step of
    it), read from Prometheus before the decision of a playbook whose cooldown ends on the
    job's progress; `error` when it could not be read."""

    last_step: float | None
    error: str = ""


def same_event(book: Playbook, starts_at: str, last_action: float,
               progress: Progress | None) -> str | None:
    """Why an alert inside the playbook's cooldown on its target is the event the last action
    there (at `last_action`, the store's time) was about ("" for a plain cooldown), or None:
    a new event, acted on.

    A plain cooldown takes every alert on the target for the same event. With
    `cooldown_ends_on: job_progress` (a stall: the target is the job) only an alert that began
    before that action, or that began after it while the job has not stepped since, is the
    same event: a requeued job restarting shows its stall again, whichever ranks the alerts
    name, until it steps. An alert that began after the action, the job having stepped since,
    is the job's next stall (of its next incarnation, or of the same one after it recovered):
    the cooldown does not hold against it (chaos soak, bug 3). A progress that could not be
    read counts as no progress (nothing is done twice)."""
    if book.cooldown_ends_on != COOLDOWN_ENDS_ON_PROGRESS:
        return ""
    began = unix_time(starts_at)
    if began is None or began <= last_action:
        return "this alert began before that action: the same event"
    if progress is None or progress.error:
        why = progress.error if progress is not None else "not read"
        return f"the job's progress since is unknown ({why[:200]}): taken as the same event"
    if progress.last_step is None or progress.last_step <= last_action:
        return "the job has not stepped since: the same stall, seen again while it restarts"
    return None


def wants_progress(book: Playbook, labels: Mapping[str, str]) -> bool:
    """Whether the job's progress can matter to this playbook's decision at all: its
    cooldown ends on it and the alert names the job. Checked before the store is asked
    whether the target was acted on inside the cooldown, so other playbooks pay nothing."""
    return book.cooldown_ends_on == COOLDOWN_ENDS_ON_PROGRESS and LABEL_JOB in labels


def read_progress(session: Any, prometheus_url: str, book: Playbook,
                  labels: Mapping[str, str]) -> Progress | None:
    """The job's progress, for a playbook whose cooldown ends on it (else None). `labels` are
    the engine's allowlisted ones (safe_labels): the job's name goes into the query."""
    if not wants_progress(book, labels):
        return None
    try:
        return Progress(job_last_step(session, prometheus_url, labels[LABEL_JOB]))
    except PrometheusError as exc:
        return Progress(None, f"Prometheus: {exc}")
