"""`quarantine`: take the faulty node out of the scheduler and restart the job without it.

Three parts, in the engine's order (remediation/engine.py calls the first two):

1. `plan_for` (before the decision, outside any transaction): classify the alert with the
   fault-class table (trainwatch.remediation.faults), resolve the suspect through the inventory's
   node
   mapping (a label that is a hostlist, a pattern or an unknown name raises LabelError: the
   intent is refused before any command runs) and read the pool's state from the scheduler.
2. `decide` (inside the engine's decision transaction, so two replicas are serialised):
   the rails. Observe-only playbooks record what would be done and page. A node already
   quarantined inside the window (the same fault seen again: XID 79, then GpuLost) is not
   drained or requeued again. Past `max_quarantined` nodes per window, or below
   `min_healthy_fraction` of the pool in service, the intent waits for approval and the
   on-call is paged. A granted quarantine is recorded as a grant row of its own
   (playbook `:quarantine`, target the scheduler node, priority -1 so no breaker counts it).
3. `run` (the step): drain with a reason naming the alert, the intent and the intent's plan,
   then requeue the jobs running on the node (the job restarts from its newest committed
   checkpoint on the nodes in service), and bring back the jobs the fault already ended there
   (a rank killed, a fatal XID that took its process: Slurm keeps a finished job's record
   for MinJobAge, and `scontrol requeue` takes it back). When the alert names the job by its
   scheduler id (training_job), only that job is touched. For `restart` (the evidence names
   more than one node, or the fault is the job's), the jobs are requeued and nothing is
   drained.

A node returns to service only through `trainwatch.remediation.cli resume-node` after the
node_health_check playbook passed on it, never because an alert resolved (a lost GPU stops
being scraped, so its alert resolves by itself): this action has no on_resolve.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from trainwatch.exporters.contract.catalog import LABEL_JOB
from trainwatch.remediation.actions.base import ActionContext, ActionError
from trainwatch.remediation.config import Config, SchedulerSettings
from trainwatch.remediation.faults import (
    DEFAULT_TABLE,
    Evidence,
    Fault,
    FaultTable,
    NodeMap,
    StallRecord,
    classify,
    load_table,
    merge_records,
)
from trainwatch.remediation.labels import LabelError, safe_labels
from trainwatch.remediation.schedulers import for_config
from trainwatch.remediation.schedulers.base import NodeNotOurs, SchedulerError
from trainwatch.remediation.schedulers.base import retry_delay as _retry_delay
from trainwatch.remediation.store import Intent, Transaction

log = logging.getLogger(__name__)

GRANT_PLAYBOOK = ":quarantine"  # no playbook name starts with ':' (schema: ^[a-z])
GRANT_PRIORITY = -1  # below every breaker's minimum: the playbook's own grant counts there
# The decisions the on-call is paged for (the engine pages after the decision is committed).
PAGED_DECISIONS = ("observe_only", "awaiting_approval", "node_not_ours")
# The labels classification reads (each allowlisted first, like every label the engine uses).
CLASSIFY_LABELS = ("alertname", "node", "xid", "rank", "training_job", "gpu")


# The playbook whose record names a stall's suspects (scope `suspects` in fault_classes.yaml):
# its `ansible` step captures trainwatch.exporters.node.tools.stack_dump's record on every node of
# the job.
DIAGNOSTICS_PLAYBOOK = "stalled_job_diagnostics"
# How much earlier than the alert's startsAt a diagnostics intent of the same stall may have
# been created (the service's clock against Prometheus's)
DIAGNOSTICS_CLOCK_SLACK_SECONDS = 60.0


class Refused(ActionError):
    """The step found a node someone else has out of service: never retried (audited as the
    intent's failure and paged)."""

    terminal = True


class EvidencePending(Exception):
    """The stall's diagnostics are still running: decide once their record is in (the engine
    looks again soon; no attempt is counted)."""


@dataclass(frozen=True)
class Diagnostics:
    """The stalled job's diagnostics, as the quarantine reads them: the intent that ran them
    (its audit record holds every node's stacks and flight-recorder summaries), the merged
    record, or why there is none."""

    intent_id: int | None = None
    record: StallRecord | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"diagnostics_intent": self.intent_id,
                "record": self.record.as_dict() if self.record else None, "note": self.note}


@dataclass(frozen=True)
class Plan:
    """What the engine decided to do about one intent, before any step runs, and on what
    evidence (the alert's labels; for a stall, the diagnostics record)."""

    intent_id: int
    fault: Fault
    pool: tuple[str, ...]
    unavailable: tuple[str, ...]  # pool nodes the scheduler has out of service now
    alert: Mapping[str, str] | None = None
    diagnostics: Diagnostics | None = None
    # the fault's nodes someone else has out of service (drained, down, reserved), as read
    not_ours: tuple[Mapping[str, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = {"intent_id": self.intent_id, "fault": self.fault.as_dict(),
               "pool": list(self.pool), "unavailable": list(self.unavailable)}
        if self.not_ours:
            out["not_ours"] = [dict(n) for n in self.not_ours]
        if self.alert is not None:
            out["alert"] = dict(self.alert)
        if self.diagnostics is not None:
            out["evidence"] = self.diagnostics.as_dict()
        return out


@functools.lru_cache(maxsize=8)
def _table(path: Path) -> FaultTable:
    return load_table(path)


def settings_of(config: Config) -> SchedulerSettings:
    if config.scheduler is None:
        raise LabelError("quarantine: no scheduler is configured (config `scheduler:`)")
    return config.scheduler


def classification_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels classification reads, each allowlisted (LabelError otherwise)."""
    return safe_labels(labels, [k for k in CLASSIFY_LABELS if labels.get(k)])


def needs_diagnostics(labels: Mapping[str, str], config: Config) -> bool:
    """Whether the alert's suspects come from the stalled-job diagnostics (scope `suspects`)."""
    if config.scheduler is None:
        return False  # plan_for refuses it anyway
    table = _table(config.scheduler.fault_classes_file or DEFAULT_TABLE)
    signal = table.signals.get(str(labels.get("alertname", "")))
    return signal is not None and signal.scope == "suspects"


def diagnostics_target(labels: Mapping[str, str]) -> str | None:
    """The diagnostics playbook's target key for the alert's job (ingest.target_key's form);
    None without a usable training_job label."""
    try:
        job = safe_labels(labels, [LABEL_JOB])[LABEL_JOB]
    except LabelError:
        return None
    return f"{LABEL_JOB}={job}"


def find_diagnostics(rows: list[Any], *, waited: float, wait_limit: float) -> Diagnostics:
    """The newest diagnostics of the stall among the job's diagnostics intents (`rows`,
    newest first): EvidencePending while one that may still act is pending or running (up
    to `wait_limit` seconds after the alert started), else the newest that acted with a
    readable record, else none (the alert's own rank and node are the evidence)."""
    waiting = []
    for row in rows:
        if row["state"] in ("pending", "running") and row["decision"] in (None, "act"):
            if waited < wait_limit:
                raise EvidencePending(f"diagnostics intent {row['id']} is {row['state']}")
            waiting.append(int(row["id"]))
            continue
        if row["state"] != "done" or row["decision"] != "act":
            continue  # cooled down, rate limited, refused, failed: no record there
        for item in json.loads(row["results"] or "[]"):
            if not isinstance(item, dict) or item.get("action") != "ansible":
                continue
            result = item.get("result")
            if not isinstance(result, dict):
                continue
            record = merge_records(result.get("captured_by_host") or {})
            if record is not None:
                return Diagnostics(int(row["id"]), record)
    note = "no diagnostics record of this stall"
    if waiting:
        note += f" (intents {waiting} still unfinished after {wait_limit:.0f}s)"
    return Diagnostics(None, None, note + ": the alert's own rank and node are the evidence")


def plan_for(intent_id: int, labels: Mapping[str, str], config: Config,
             diagnostics: Diagnostics | None = None) -> Plan:
    """Classify and resolve (LabelError: refuse) and read the pool (SchedulerError: retry).
    A stall's suspects are the nodes of the ranks its diagnostics record blames."""
    from trainwatch.remediation.actions.ansible import state_dir

    settings = settings_of(config)
    table = _table(settings.fault_classes_file or DEFAULT_TABLE)
    nodes = NodeMap.from_inventory(config.ansible_inventory, state_dir(config))
    clean = classification_labels(labels)
    scheduler = for_config(config)
    evidence = Evidence()
    signal = table.signals.get(clean.get("alertname", ""))
    if signal is not None and signal.needs_ranks:
        node = nodes.node_for(clean.get("node"), "node label")
        evidence = Evidence(node_hosts_ranks=bool(scheduler.jobs_on(node)))
    elif signal is not None and signal.scope == "suspects" and diagnostics is not None \
            and diagnostics.record is not None:
        # every host the record names goes through the node mapping in classify()
        evidence = Evidence(suspect_nodes=diagnostics.record.suspect_hosts or None)
    fault = classify(table, clean, nodes, evidence)
    states = scheduler.node_states(nodes.pool)
    unavailable = tuple(n for n in nodes.pool if n not in states or not states[n].in_service)
    not_ours = tuple(states[n].as_dict() for n in fault.nodes
                     if n in states and states[n].someone_elses)
    return Plan(intent_id, fault, nodes.pool, unavailable, alert=clean,
                diagnostics=diagnostics, not_ours=not_ours)


def recent_quarantines(tx: Transaction, since: float) -> list[str]:
    return tx.grant_targets(GRANT_PLAYBOOK, since)


def decide(tx: Transaction, plan: Plan, *, approved: bool, observe_only: bool,
           settings: SchedulerSettings, now: float) -> tuple[str, str, str, dict[str, Any]] | None:
    """Inside the engine's decision transaction: None to go on (grant), else (decision, state,
    reason, detail) to finish the intent with. The caller pages for observe_only and
    awaiting_approval."""
    fault = plan.fault
    detail: dict[str, Any] = {"plan": plan.as_dict()}
    if fault.action == "none":
        return ("not_actionable", "done", f"{fault.alertname}: {fault.reason}; nothing "
                "automatic (the alert pages)", detail)
    if plan.not_ours:
        named = "; ".join(f"{n['node']} is {n['state']} ({n['reason']!r})" for n in plan.not_ours)
        return ("node_not_ours", "done", f"{named}: out of service by someone else, so "
                "Trainwatch neither drains nor requeues there; the on-call decides", detail)
    recent = recent_quarantines(tx, now - settings.quarantine_window_seconds)
    detail["quarantined_in_window"] = recent
    if fault.action == "quarantine":
        node = fault.nodes[0]
        if node in recent:
            return ("already_quarantined", "done", f"{node} is already quarantined for this "
                    f"fault (within {settings.quarantine_window_seconds:.0f}s): not drained or "
                    "requeued again", detail)
    if observe_only:
        return ("observe_only", "done", "observe-only: would " + describe(plan), detail)
    if fault.action == "quarantine" and not approved:
        node = fault.nodes[0]
        if len(recent) >= settings.max_quarantined:
            return ("awaiting_approval", "awaiting_approval",
                    f"rail: {len(recent)} nodes quarantined in the last "
                    f"{settings.quarantine_window_seconds:.0f}s (max_quarantined "
                    f"{settings.max_quarantined}); draining {node} needs approval", detail)
        out = set(plan.unavailable) | set(recent) | {node}
        healthy = len([n for n in plan.pool if n not in out])
        detail["healthy_after"] = healthy
        if healthy < settings.min_healthy_fraction * len(plan.pool):
            return ("awaiting_approval", "awaiting_approval",
                    f"rail: draining {node} would leave {healthy} of {len(plan.pool)} nodes "
                    f"in service, below min_healthy_fraction {settings.min_healthy_fraction:g}; "
                    "needs approval", detail)
    return None


def record_grant(tx: Transaction, plan: Plan, now: float) -> None:
    """Next to the engine's own grant: this node counts as quarantined from now on."""
    if plan.fault.action == "quarantine":
        tx.add_grant(now, GRANT_PLAYBOOK, plan.fault.nodes[0], plan.intent_id, GRANT_PRIORITY)


def describe(plan: Plan) -> str:
    fault = plan.fault
    if fault.action == "quarantine":
        return (f"drain {fault.nodes[0]} and requeue the jobs running on it "
                f"({fault.alertname}, {fault.fault_class})")
    if fault.nodes:
        return (f"requeue the jobs running on {', '.join(fault.nodes)} without draining "
                f"({fault.alertname}, {fault.fault_class})")
    return f"nothing: no node to find the job on ({fault.alertname})"


def drain_reason(plan: Plan) -> str:
    fault = plan.fault
    xid = f" XID {fault.xid}" if fault.xid is not None else ""
    return (f"{fault.alertname}{xid} intent {plan.intent_id}: quarantine ({fault.fault_class}),"
            f" job requeued, resume after node_health_check")


def post_page(session: requests.Session, config: Config, body: dict[str, Any]) -> None:
    """Post one page to pager_url; a page that fails is logged (the audit has the same
    content)."""
    if not config.pager_url:
        log.warning("quarantine %s for intent %s: no pager_url to page", body.get("event"),
                    body.get("intent_id"))
        return
    try:
        session.post(config.pager_url, json=body, timeout=config.request_timeout_seconds)
    except requests.RequestException as exc:
        log.warning("quarantine: paging failed: %s", exc)


def page(session: requests.Session, config: Config, decision: str, reason: str,
         plan: Plan, labels: Mapping[str, str]) -> None:
    """Tell the on-call (pager_url) what the rails held back, what observe-only would have
    done, or whose node Trainwatch left alone."""
    post_page(session, config, {
        "event": f"quarantine_{decision}", "intent_id": plan.intent_id,
        "alertname": labels.get("alertname", ""), "summary": reason, "plan": plan.as_dict()})


def retry_delay(config: Config, attempts: int) -> float | None:
    """Seconds until the next try of a quarantine whose scheduler failed `attempts` times, or
    None: give up (the scheduler's retry_until has passed in waits)."""
    settings = settings_of(config)
    return _retry_delay(attempts, first=config.retry_backoff_seconds,
                        longest=settings.retry_backoff_max_seconds,
                        until=settings.retry_until_seconds)


def page_failure(session: requests.Session, config: Config, intent: Intent, attempts: int,
                 message: str) -> None:
    """The quarantine failed for good (the scheduler did not answer, or answered something
    that did not read back, until its deadline; or a node turned out to be someone else's):
    nothing more happens unless the alert fires again, so a person must look."""
    post_page(session, config, {
        "event": "quarantine_failed", "intent_id": intent.id, "alertname": intent.alertname,
        "summary": f"quarantine of intent {intent.id} ({intent.alertname}) failed after "
                   f"{attempts} attempts: {message[:1000]}",
        "target": intent.target_key})


def jobs_to_requeue(scheduler: Any, plan: Plan,
                    named: str | None = None) -> tuple[list[Any], str]:
    """The running Slurm jobs the fault stopped, and how they were found. A node's fault
    stops every job on the node, or only the named one when the alert names its Slurm job
    (named_job); a stall stops its own job only: the Slurm job ids its ranks carry
    (SLURM_JOB_ID, in the diagnostics record), among the jobs on the suspect nodes. A stall
    with no such id requeues nothing (the on-call has TrainingStalled)."""
    on_nodes = {job.job_id: job for node in plan.fault.nodes for job in scheduler.jobs_on(node)}
    if plan.diagnostics is None:  # not a stall
        if named is not None:
            return ([job for job_id, job in on_nodes.items() if job_id == named],
                    f"the alert's Slurm job {named}")
        return list(on_nodes.values()), "every job on the fault's nodes"
    record = plan.diagnostics.record
    ids = set(record.scheduler_jobs) if record is not None else set()
    if not ids:
        return [], ("the stall's ranks carry no Slurm job id (no diagnostics record): no job "
                    "requeued")
    return ([job for job_id, job in on_nodes.items() if job_id.split("_")[0] in ids],
            f"the stalled ranks' Slurm jobs {sorted(ids)}")


def run(step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    plan: Plan | None = ctx.plan
    if plan is None:
        raise ActionError("quarantine: no plan (the engine computes one before the steps)")
    scheduler = for_config(ctx.config)
    fault = plan.fault
    result: dict[str, Any] = {"plan": plan.as_dict(), "requeued": []}
    try:
        if fault.action == "quarantine":
            result["drain"] = scheduler.drain(fault.nodes[0], drain_reason(plan))
        named = named_job(plan)
        if fault.ends_job:  # the fault ended its job: no running job is touched
            jobs, result["jobs_by"] = [], ("none running: the fault ended its job, only a job "
                                           "it ended is brought back")
        else:
            jobs, result["jobs_by"] = jobs_to_requeue(scheduler, plan, named)
        ended = ended_jobs(scheduler, fault.nodes, named)
        if plan.diagnostics is not None:  # a stall: its own Slurm jobs only, ended ones too
            record = plan.diagnostics.record
            own = set(record.scheduler_jobs) if record is not None else set()
            ended = [job for job in ended if job.job_id.split("_")[0] in own]
        if fault.action != "quarantine" and (jobs or ended):
            # no drain checked the node: check it is not someone else's right before
            check_ours(scheduler, fault.nodes)
        for job in jobs:
            result["requeued"].append(scheduler.requeue(job))
        for job in ended:
            result["requeued"].append(scheduler.requeue_ended(job))
    except NodeNotOurs as exc:
        raise Refused(f"quarantine: {exc}") from exc
    except SchedulerError as exc:
        raise ActionError(f"quarantine: {exc}") from exc
    return result


def check_ours(scheduler: Any, nodes: tuple[str, ...]) -> None:
    """NodeNotOurs when someone else has one of `nodes` out of service (sched36's rule:
    Trainwatch neither drains nor requeues there), read right before a restart's requeue."""
    states = scheduler.node_states(tuple(nodes))
    for node in nodes:
        current = states.get(node)
        if current is not None and current.someone_elses:
            raise NodeNotOurs(f"slurm: node {node!r} is {current.state} by someone else "
                              f"({current.reason!r}); Trainwatch neither drains nor requeues "
                              "there")


def named_job(plan: Plan) -> str | None:
    """The scheduler job id the alert names: its training_job when that is a job id (the
    ranks name their job by the scheduler's id, e.g. `--rdzv-id=$SLURM_JOB_ID`); None
    otherwise. The adapter checks it again and looks it up on the suspect node only."""
    job = (plan.alert or {}).get(LABEL_JOB, "")
    return job if job.isascii() and job.isdigit() and len(job) <= 12 else None


def ended_jobs(scheduler: Any, nodes: tuple[str, ...], named: str | None) -> list[Any]:
    """The jobs the fault already ended on the suspect nodes (a rank killed, a fatal XID
    that took its process): the named job where it ran there, else (the alert names no
    scheduler job, or one that did not run there) every job a fault ended there while the
    scheduler keeps its record."""
    found: dict[str, Any] = {}
    for node in nodes:
        jobs = scheduler.ended_jobs(node, named) if named is not None else []
        found.update((job.job_id, job) for job in jobs or scheduler.ended_jobs(node))
    return list(found.values())
