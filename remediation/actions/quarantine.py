"""`quarantine`: take the faulty node out of the scheduler and restart the job without it.

The engine calls it through the action interface (trainwatch.remediation.actions.base):

1. `plan` (before the decision, outside any transaction): classify the alert with the
   fault-class table (trainwatch.remediation.faults), resolve the suspect through the
   inventory's node mapping (a label that is a hostlist, a pattern or an unknown name raises
   LabelError: the intent is refused before any command runs) and read the pool's state from
   the scheduler. A stall's suspects come from its diagnostics record: EvidencePending while
   the diagnostics may still act.
2. `rails` (inside the engine's decision transaction, so two replicas are serialised):
   observe-only playbooks record what would be done and page. A node whose quarantine still
   holds (drained and not returned, or a drain under way) is not drained or requeued again,
   and neither is one a fast alert drained for the same event: a rule's alert that begins
   within `rule_alert_lag` of that drain (`already_healed`, also after the node was returned).
   Past `max_quarantined` nodes drained per window, or below `min_healthy_fraction` of the
   pool in service, the intent waits for approval with a page naming every rail that tripped;
   an approval overrides exactly those, and the rails are checked again when it is used. A
   restart-only fault restarts a job at most `max_restarts` times per `restart_window`, then
   pages instead.
3. `granted`: the quarantine is a grant row of its own (playbook `:quarantine`, target the
   scheduler node, priority -1 so no breaker counts it) that holds while its intent's drain
   happened or may still happen: it ends when its intent failed or was cancelled, and when
   trainwatch-resume-node returns the node (`end_quarantine`). A node returned and faulting
   again is drained again at once; the `lemon_faults`-th drain of one node inside the window
   pages, and the node is kept out (`kept_out`: resume refuses) until its faults leave the
   window.
4. `run` (the step): drain with a reason naming the alert, the intent and the plan, then
   requeue the jobs running on the node (the job restarts from its newest committed
   checkpoint on the nodes in service), and bring back the jobs the fault already ended there
   (a rank killed, a fatal XID that took its process: Slurm keeps a finished job's record for
   MinJobAge, and `scontrol requeue` takes it back). When the alert names the job by its
   scheduler id (training_job), only that job is touched. For `restart` (the evidence names
   more than one node, or the fault is the job's), the jobs are requeued and nothing is
   drained; the restart cap counts the jobs `stopped_jobs` finds at plan time, ended ones too.

A node returns to service only through `trainwatch-resume-node` after the node_health_check
playbook passed on it, never because an alert resolved (a lost GPU stops being scraped, so its
alert resolves by itself): this action has no on_resolve, and an intent its rails hold for
approval outlives the alert's resolve until it is decided or its hold expires (with a page).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwatch.exporters.contract.catalog import LABEL_FAST, LABEL_JOB
from trainwatch.remediation.actions.base import (
    Action,
    ActionContext,
    ActionError,
    EvidencePending,
    Plan,
    RailsContext,
    Verdict,
)
from trainwatch.remediation.config import Config, SchedulerSettings
from trainwatch.remediation.decisions import Decision
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
from trainwatch.remediation.pager import Page
from trainwatch.remediation.recovery import unix_time
from trainwatch.remediation.schedulers import for_config
from trainwatch.remediation.schedulers.base import NodeNotOurs, SchedulerError
from trainwatch.remediation.schedulers.base import retry_delay as _retry_delay
from trainwatch.remediation.store import GrantRow, Intent, Store, Transaction

log = logging.getLogger(__name__)

NAME = "quarantine"
GRANT_PLAYBOOK = ":quarantine"  # no playbook name starts with ':' (schema: ^[a-z])
RESTART_GRANTS = ":restart"  # one grant per job restarted for a restart-only fault
# One row per node a fast alert drained, at the event's time (the fast alert's startsAt): what
# tells the rule's own alert of the same event, which begins a minute or two later, from a new
# fault (rule_alert_lag); it never holds anything.
FAST_DRAINS = ":fast-drain"
# The exporter's clock against Prometheus's: a rule alert may begin this much before the
# fast alert of the same event by their clocks.
FAST_CLOCK_SLACK_SECONDS = 10.0
# How long the step waits for Slurm to end a job whose rank died (srun's kill-on-bad-exit
# takes a second or two), and how often it looks.
ENDING_WAIT_SECONDS = 30.0
ENDING_POLL_SECONDS = 0.5
# A restart this long before the startsAt of a fault that ends its job (a killed rank) still
# counts as its heal: the fast alerts of one death (each node's first killed rank: srun kills
# the other ranks right after) start seconds apart. A job that is ended again when planned is
# a new death whatever the times.
RESTART_SETTLE_SECONDS = 10.0
GRANT_PRIORITY = -1  # below every breaker's minimum: the playbook's own grant counts there
# The rails an approval can override (named in the hold's page and audit).
MAX_QUARANTINED = "max_quarantined"
MIN_HEALTHY = "min_healthy_fraction"
# The labels classification reads (each allowlisted first, like every label the engine uses).
CLASSIFY_LABELS = ("alertname", "node", "xid", "rank", "training_job", "gpu")


# The playbook whose record names a stall's suspects (scope `suspects` in fault_classes.yaml):
# its `ansible` step captures trainwatch.exporters.node.tools.stack_dump's record on every node
# of the job.
DIAGNOSTICS_PLAYBOOK = "stalled_job_diagnostics"
# How much earlier than the alert's startsAt a diagnostics intent of the same stall may have
# been created (the service's clock against Prometheus's)
DIAGNOSTICS_CLOCK_SLACK_SECONDS = 60.0


class Refused(ActionError):
    """The step found a node someone else has out of service: never retried (audited as the
    intent's failure and paged)."""

    terminal = True


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
class QuarantinePlan(Plan):
    """What the quarantine will do about one intent, before any step runs, and on what
    evidence (the alert's labels; for a stall, the diagnostics record; for a restart-only
    fault, the jobs running on the nodes)."""

    intent_id: int
    fault: Fault
    pool: tuple[str, ...]
    unavailable: tuple[str, ...]  # pool nodes the scheduler has out of service now
    alert: Mapping[str, str] | None = None
    diagnostics: Diagnostics | None = None
    jobs: tuple[str, ...] = ()  # restart-only: the jobs on the nodes when planned
    fault_at: float | None = None  # the alert's startsAt (UNIX time), when it has one
    ended: tuple[str, ...] = ()  # restart-only: of `jobs`, those ended when planned
    # the fault's nodes someone else has out of service (drained, down, reserved), as read
    not_ours: tuple[Mapping[str, str], ...] = ()
    # the alert is an exporter's fast alert (label trainwatch_fast="true"), not a rule's
    fast: bool = False

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"intent_id": self.intent_id, "fault": self.fault.as_dict(),
                               "pool": list(self.pool), "unavailable": list(self.unavailable)}
        if self.not_ours:
            out["not_ours"] = [dict(n) for n in self.not_ours]
        if self.alert is not None:
            out["alert"] = dict(self.alert)
        if self.diagnostics is not None:
            out["evidence"] = self.diagnostics.as_dict()
        if self.jobs:
            out["jobs"] = list(self.jobs)
        if self.fault_at is not None:
            out["fault_at"] = self.fault_at
        if self.fast:
            out["fast"] = True
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
             diagnostics: Diagnostics | None = None) -> QuarantinePlan:
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
    plan = QuarantinePlan(intent_id, fault, nodes.pool, unavailable, alert=clean,
                          diagnostics=diagnostics, not_ours=not_ours)
    if fault.action != "restart":
        return plan
    stopped = stopped_jobs(scheduler, plan)
    jobs = tuple(sorted({job.job_id for job in stopped.running + stopped.ended
                         + stopped.ending}))
    return dataclasses.replace(plan, jobs=jobs,
                               ended=tuple(sorted({job.job_id for job in stopped.ended})))


def diagnostics_for(intent: Intent, config: Config, store: Store) -> Diagnostics:
    """The stall's diagnostics record, from the job's stalled_job_diagnostics intent
    (this alert's, or another alert's of the same stall: that playbook runs once per job
    and cooldown). EvidencePending while it may still act: the record decides which node
    is suspect, so the quarantine waits for it, up to two action timeouts and a minute
    after the alert started; past that, or without one, the alert's own rank is."""
    key = diagnostics_target(intent.labels)
    if key is None:
        return Diagnostics(note="no training_job label to find the diagnostics by")
    now = time.time()
    started = unix_time(intent.starts_at) or now
    with store.transaction() as tx:
        rows = tx.recent_firing_intents(DIAGNOSTICS_PLAYBOOK, key,
                                        started - DIAGNOSTICS_CLOCK_SLACK_SECONDS)
    return find_diagnostics(rows, waited=now - started,
                            wait_limit=2 * config.action_timeout_seconds + 60)


# --- the rails ------------------------------------------------------------------------------
def happened(row: GrantRow) -> bool:
    """A grant whose steps ran or may still run (not failed, cancelled, refused, rejected)."""
    return row.intent_state not in ("failed", "cancelled", "refused", "rejected")


def faults_of(history: list[GrantRow], node: str) -> list[float]:
    """When `node` was quarantined, oldest first, in `history` (drains that happened)."""
    return [row.at for row in history if row.target_key == node and happened(row)]


def kept_out(tx: Transaction, node: str, settings: SchedulerSettings, now: float) -> str | None:
    """Why `node` stays out of service (a lemon: `lemon_faults` quarantines inside the
    window), or None. trainwatch-resume-node refuses while this says why."""
    window = settings.quarantine_window_seconds
    faults = faults_of(tx.grant_history(GRANT_PLAYBOOK, now - window, node), node)
    if len(faults) < settings.lemon_faults:
        return None
    return (f"{node} was quarantined {len(faults)} times in the last {window:.0f}s "
            f"(lemon_faults {settings.lemon_faults}): kept out until the oldest of them is "
            f"{window:.0f}s old")


def node_faults(store: Store, settings: SchedulerSettings, now: float) -> dict[str, list[float]]:
    """Every node quarantined inside the window: when, oldest first (for /metrics)."""
    history = store.grant_history(GRANT_PLAYBOOK, now - settings.quarantine_window_seconds)
    out: dict[str, list[float]] = {}
    for row in history:
        if happened(row):
            out.setdefault(row.target_key, []).append(row.at)
    return out


def end_quarantine(tx: Transaction, node: str, now: float) -> int:
    """The node is back in service (trainwatch-resume-node): its quarantine no longer holds,
    and its next fault drains it again. It stays in the fault history."""
    return tx.end_grants(GRANT_PLAYBOOK, now, target_key=node)


def _hold(plan: QuarantinePlan, tripped: dict[str, str], detail: dict[str, Any],
          context: RailsContext, settings: SchedulerSettings) -> Verdict:
    rails = tuple(sorted(tripped))
    node = plan.fault.nodes[0]
    again = (f" (approved over {sorted(context.approved_rails)}, but "
             f"{sorted(set(rails) - context.approved_rails)} tripped since)"
             if context.approved else "")
    reason = ("rails: " + "; ".join(tripped[r] for r in rails)
              + f"; draining {node} needs approval{again}")
    detail = {**detail, "rails": list(rails)}
    page = Page(f"quarantine_{Decision.AWAITING_APPROVAL}", plan.intent_id, context.alertname,
                reason, {"rails": list(rails), "plan": plan.as_dict()})
    return Verdict(Decision.AWAITING_APPROVAL, "awaiting_approval", reason, detail, rails,
                   page, hold_seconds=settings.hold_expiry_seconds)


def _restart_rails(tx: Transaction, plan: QuarantinePlan, settings: SchedulerSettings,
                   context: RailsContext, detail: dict[str, Any]) -> Verdict | None:
    """A restart-only fault restarts each job at most `max_restarts` times per
    `restart_window`; past it, the on-call is paged instead."""
    window = settings.restart_window_seconds
    history = tx.grant_history(RESTART_GRANTS, context.now - window)
    if plan.fault.ends_job and plan.fault_at is not None:
        # One death seen twice (two ranks of the job, the exporter's fast alert and the
        # rule's, two nodes): the restart that came after it began healed it already.
        since = plan.fault_at - RESTART_SETTLE_SECONDS
        # A job that is ended now died again, whenever it was restarted: only a job back in
        # the queue or running can be the one a restart already healed.
        back = set(plan.jobs) - set(plan.ended)
        done = sorted({row.target_key for row in history if row.target_key in back
                       and happened(row) and row.at >= since})
        if done and set(done) == set(plan.jobs):
            return Verdict(Decision.ALREADY_RESTARTED, "done",
                           f"job(s) {', '.join(done)} restarted after this fault began: the "
                           "same death, not restarted again", {**detail, "restarted": done})
    counts = {job: sum(1 for row in history if row.target_key == job and happened(row))
              for job in plan.jobs}
    over = sorted(job for job, n in counts.items() if n >= settings.max_restarts)
    if not over:
        return None
    reason = (f"job(s) {', '.join(over)} restarted {max(counts[j] for j in over)} times in "
              f"the last {window:.0f}s (max_restarts {settings.max_restarts}): not restarted "
              "again; a person decides")
    detail = {**detail, "restarts_in_window": counts}
    page = Page(f"quarantine_{Decision.RESTART_LIMITED}", plan.intent_id, context.alertname,
                reason, {"jobs": over, "plan": plan.as_dict()})
    return Verdict(Decision.RESTART_LIMITED, "done", reason, detail, page=page)


def rails(tx: Transaction, plan: QuarantinePlan, settings: SchedulerSettings,
          context: RailsContext) -> Verdict | None:
    """Inside the engine's decision transaction: None to go on (grant), else the verdict."""
    fault = plan.fault
    detail: dict[str, Any] = {"plan": plan.as_dict()}
    if fault.action == "none":
        return Verdict(Decision.NOT_ACTIONABLE, "done", f"{fault.alertname}: {fault.reason}; "
                       "nothing automatic (the alert pages)", detail)
    if plan.not_ours:
        return _not_ours(plan, detail, context)
    if fault.action == "restart":
        if context.observe_only:
            return _observe(plan, detail, context)
        return _restart_rails(tx, plan, settings, context, detail)
    node = fault.nodes[0]
    window = settings.quarantine_window_seconds
    history = tx.grant_history(GRANT_PLAYBOOK, context.now - window)
    holding = sorted({row.target_key for row in history if row.holds})
    detail["quarantined_now"] = holding
    if node in holding:
        return Verdict(Decision.ALREADY_QUARANTINED, "done",
                       f"{node} is already quarantined for this fault (its drain holds until "
                       "trainwatch-resume-node returns it): not drained or requeued again",
                       detail)
    healed = _drained_by_fast_alert(tx, plan, settings)
    if healed is not None:
        detail["fast_drain_intent"] = healed.intent_id
        return Verdict(Decision.ALREADY_HEALED, "done",
                       f"{node} was drained for this event by the exporter's fast alert "
                       f"(intent {healed.intent_id}, "
                       f"{plan.fault_at - healed.at:.0f}s before this rule alert began, within "
                       f"rule_alert_lag {settings.rule_alert_lag_seconds:.0f}s): the rule's "
                       "own alert of the same event, not drained again", detail)
    if context.observe_only:
        return _observe(plan, detail, context)
    drained = sorted({row.target_key for row in history if happened(row)} - {node})
    detail["drained_in_window"] = drained
    tripped: dict[str, str] = {}
    if len(drained) >= settings.max_quarantined:
        tripped[MAX_QUARANTINED] = (
            f"{len(drained)} other nodes quarantined in the last {window:.0f}s "
            f"(max_quarantined {settings.max_quarantined})")
    out = set(plan.unavailable) | set(holding) | {node}
    healthy = len([n for n in plan.pool if n not in out])
    detail["healthy_after"] = healthy
    if healthy < settings.min_healthy_fraction * len(plan.pool):
        tripped[MIN_HEALTHY] = (
            f"draining {node} would leave {healthy} of {len(plan.pool)} nodes in service, "
            f"below min_healthy_fraction {settings.min_healthy_fraction:g}")
    unapproved = set(tripped) - (context.approved_rails if context.approved else set())
    if unapproved:
        return _hold(plan, tripped, detail, context, settings)
    return None


def _drained_by_fast_alert(tx: Transaction, plan: QuarantinePlan,
                           settings: SchedulerSettings) -> GrantRow | None:
    """For a rule's alert: the drain of its node by a fast alert whose event began at most
    rule_alert_lag before it (the same event, seen first by the exporter), or None. The node
    may have been returned since: its drain no longer holds, yet this alert is no new fault.
    A fast alert is never absorbed: each is an event of its own, and a returned node's next
    one drains it again."""
    if plan.fast or plan.fault_at is None:
        return None
    node = plan.fault.nodes[0]
    rows = tx.grant_history(FAST_DRAINS, plan.fault_at - settings.rule_alert_lag_seconds, node)
    same = [row for row in rows
            if happened(row) and row.at <= plan.fault_at + FAST_CLOCK_SLACK_SECONDS]
    return same[-1] if same else None


def _not_ours(plan: QuarantinePlan, detail: dict[str, Any], context: RailsContext) -> Verdict:
    """A node of the fault is out of service by someone else (a person or Slurm drained, downed
    or reserved it): Trainwatch neither drains nor requeues there, and pages."""
    named = "; ".join(f"{n['node']} is {n['state']} ({n['reason']!r})" for n in plan.not_ours)
    reason = (f"{named}: out of service by someone else, so Trainwatch neither drains nor "
              "requeues there; the on-call decides")
    page = Page(f"quarantine_{Decision.NODE_NOT_OURS}", plan.intent_id, context.alertname,
                reason, {"plan": plan.as_dict()})
    return Verdict(Decision.NODE_NOT_OURS, "done", reason, detail, page=page)


def _observe(plan: QuarantinePlan, detail: dict[str, Any], context: RailsContext) -> Verdict:
    reason = "observe-only: would " + describe(plan)
    page = Page(f"quarantine_{Decision.OBSERVE_ONLY}", plan.intent_id, context.alertname,
                reason, {"plan": plan.as_dict()})
    return Verdict(Decision.OBSERVE_ONLY, "done", reason, detail, page=page)


def granted(tx: Transaction, plan: QuarantinePlan, settings: SchedulerSettings,
            now: float, alertname: str) -> Page | None:
    """Next to the engine's own grant: the node counts as quarantined from now on (a
    restart-only fault: each job as restarted). The `lemon_faults`-th quarantine of a node in
    the window pages: it stays out."""
    fault = plan.fault
    if fault.action == "restart":
        for job in plan.jobs:
            tx.add_grant(now, RESTART_GRANTS, job, plan.intent_id, GRANT_PRIORITY)
        return None
    if fault.action != "quarantine":
        return None
    node = fault.nodes[0]
    tx.add_grant(now, GRANT_PLAYBOOK, node, plan.intent_id, GRANT_PRIORITY)
    if plan.fast and plan.fault_at is not None:
        # never later than now: a node's clock running ahead must not place the event where
        # it would absorb a later fault's rule alert
        tx.add_grant(min(plan.fault_at, now), FAST_DRAINS, node, plan.intent_id,
                     GRANT_PRIORITY)
    why = kept_out(tx, node, settings, now)
    if why is None:
        return None
    return Page("quarantine_lemon_node", plan.intent_id, alertname, why,
                {"node": node, "plan": plan.as_dict()})





def describe(plan: QuarantinePlan) -> str:
    fault = plan.fault
    if fault.action == "quarantine":
        return (f"drain {fault.nodes[0]} and requeue the jobs running on it "
                f"({fault.alertname}, {fault.fault_class})")
    if fault.nodes:
        return (f"requeue the jobs running on {', '.join(fault.nodes)} without draining "
                f"({fault.alertname}, {fault.fault_class})")
    return f"nothing: no node to find the job on ({fault.alertname})"


def drain_reason(plan: QuarantinePlan) -> str:
    fault = plan.fault
    xid = f" XID {fault.xid}" if fault.xid is not None else ""
    return (f"{fault.alertname}{xid} intent {plan.intent_id}: quarantine ({fault.fault_class}),"
            f" job requeued, resume after node_health_check")


def retry_delay(config: Config, attempts: int) -> float | None:
    """Seconds until the next try of a quarantine whose scheduler failed `attempts` times, or
    None: give up (the scheduler's retry_until has passed in waits)."""
    settings = settings_of(config)
    return _retry_delay(attempts, first=config.retry_backoff_seconds,
                        longest=settings.retry_backoff_max_seconds,
                        until=settings.retry_until_seconds)


def failure_page(intent: Intent, attempts: int, message: str) -> Page:
    """The quarantine failed for good (the scheduler did not answer, or answered something
    that did not read back, until its deadline; or a node turned out to be someone else's):
    nothing more happens unless the alert fires again, so a person must look."""
    return Page("quarantine_failed", intent.id, intent.alertname,
                f"quarantine of intent {intent.id} ({intent.alertname}) failed after "
                f"{attempts} attempts: {message[:1000]}", {"target": intent.target_key})


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


def named_job(alert: Mapping[str, str]) -> str | None:
    """The scheduler job id the alert names: its training_job when that is a job id (the
    ranks name their job by the scheduler's id, e.g. `--rdzv-id=$SLURM_JOB_ID`); None
    otherwise. The adapter checks it again and looks it up on the suspect node only."""
    job = alert.get(LABEL_JOB, "")
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


def jobs_to_requeue(scheduler: Any, plan: QuarantinePlan,
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


@dataclass(frozen=True)
class StoppedJobs:
    """The jobs a fault stopped, as read from the scheduler: still running there (to requeue),
    already ended by the fault (to bring back), and, for a fault that ends its job, the jobs
    it has not ended yet (`ending`: a fast alert arrives before Slurm ends the job); and how
    they were found."""

    running: list[Any]
    ended: list[Any]
    found_by: str
    ending: list[Any] = dataclasses.field(default_factory=list)


def _named_on(read: Callable[[str], list[Any]], nodes: tuple[str, ...],
              named: str | None) -> list[Any]:
    """What `read` lists on `nodes` (each job once): the named job, else every one."""
    found = {job.job_id: job for node in nodes for job in read(node)}
    return [job for job_id, job in found.items() if named is None or job_id == named]


def ending_jobs(scheduler: Any, nodes: tuple[str, ...], named: str | None) -> list[Any]:
    """The jobs still on `nodes` that a fault ending its job may be ending: the named one,
    else every one there."""
    return _named_on(scheduler.jobs_on, nodes, named)


def completing_jobs(scheduler: Any, nodes: tuple[str, ...], named: str | None) -> list[Any]:
    """The jobs ending on `nodes` now (the named one, else every one there)."""
    return _named_on(scheduler.completing_jobs, nodes, named)


def stopped_jobs(scheduler: Any, plan: QuarantinePlan,
                 wait_seconds: float = 0.0) -> StoppedJobs:
    """One reading of which jobs the fault stopped, for the plan (the restart cap counts them)
    and for the step (which requeues them): a fault that ended its job touches no running
    job, but waits up to `wait_seconds` for a job it is still ending (a rank's death reaches
    the webhook in a second; srun's kill-on-bad-exit ends the job a second or two later); a
    stall's ended jobs are its own Slurm jobs only."""
    fault = plan.fault
    named = named_job(plan.alert or {})
    if fault.ends_job:
        running: list[Any] = []
        found_by = "none running: the fault ended its job, only a job it ended is brought back"
    else:
        running, found_by = jobs_to_requeue(scheduler, plan, named)
    ended = ended_jobs(scheduler, fault.nodes, named)
    if plan.diagnostics is not None:
        record = plan.diagnostics.record
        own = set(record.scheduler_jobs) if record is not None else set()
        ended = [job for job in ended if job.job_id.split("_")[0] in own]
    ending: list[Any] = []
    if fault.ends_job and not ended:
        deadline = time.monotonic() + wait_seconds
        ending = ending_jobs(scheduler, fault.nodes, named)
        # A job seen running is watched until it reads as ended, not only while it reads as
        # running: in between, Slurm shows it COMPLETING with no fault's reason yet (the
        # epilog runs), in neither reading (benchmarks/recovery.py lost a job that way). The
        # step's reading comes after the plan's: a job the plan saw may be in between already.
        watched = bool(ending) or bool(plan.jobs)
        while watched and time.monotonic() < deadline:
            time.sleep(ENDING_POLL_SECONDS)
            ended = ended_jobs(scheduler, fault.nodes, named)
            if ended:
                ending = []
                break
            ending = ending_jobs(scheduler, fault.nodes, named)
    elif (not fault.ends_job and plan.diagnostics is None and not running and not ended
          and wait_seconds > 0):
        # A node's fault that took its job's process with it (a fatal XID) can meet the job
        # in between too: no longer running, not ended yet. Watched while it is COMPLETING,
        # brought back if it ends by the fault (benchmarks/recovery.py, attempt 6b: the
        # quarantine drained and found no job; only the dying rank's alert requeued it).
        deadline = time.monotonic() + wait_seconds
        while (completing_jobs(scheduler, fault.nodes, named)
               and time.monotonic() < deadline):
            time.sleep(ENDING_POLL_SECONDS)
            ended = ended_jobs(scheduler, fault.nodes, named)
            if ended:
                break
    return StoppedJobs(running, ended, found_by, ending)


def run(step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    plan = ctx.plan
    if not isinstance(plan, QuarantinePlan):
        raise ActionError("quarantine: no plan (the engine computes one before the steps)")
    scheduler = for_config(ctx.config)
    fault = plan.fault
    result: dict[str, Any] = {"plan": plan.as_dict(), "requeued": []}
    try:
        if fault.action == "quarantine":
            result["drain"] = scheduler.drain(fault.nodes[0], drain_reason(plan))
        stopped = stopped_jobs(scheduler, plan, ENDING_WAIT_SECONDS)
        result["jobs_by"] = stopped.found_by
        if stopped.ending:
            # the rank died but its job lives on (torchrun elastic restarted it in place, or
            # no kill-on-bad-exit): not Trainwatch's to requeue
            result["still_running"] = [job.job_id for job in stopped.ending]
        if fault.action != "quarantine" and (stopped.running or stopped.ended):
            # no drain checked the node: check it is not someone else's right before
            check_ours(scheduler, fault.nodes)
        for job in stopped.running:
            result["requeued"].append(scheduler.requeue(job))
        for job in stopped.ended:
            result["requeued"].append(scheduler.requeue_ended(job))
    except NodeNotOurs as exc:
        raise Refused(f"quarantine: {exc}") from exc
    except SchedulerError as exc:
        raise ActionError(f"quarantine: {exc}") from exc
    return result


class Quarantine(Action):
    name = NAME
    outlives_resolve = True  # a resolved alert does not mean a healthy node
    retries_when_fired_again = True  # the scheduler away past retry_until is not a verdict

    def plan(self, intent: Intent, steps: tuple[dict[str, Any], ...], config: Config,
             store: Store) -> QuarantinePlan:
        diagnostics = diagnostics_for(intent, config, store) \
            if needs_diagnostics(intent.labels, config) else None
        try:
            return dataclasses.replace(plan_for(intent.id, intent.labels, config, diagnostics),
                                       fault_at=unix_time(intent.starts_at),
                                       fast=intent.labels.get(LABEL_FAST) == "true")
        except SchedulerError as exc:
            raise ActionError(f"quarantine: {exc}") from exc

    def rails(self, tx: Transaction, plan: Plan, config: Config,
              context: RailsContext) -> Verdict | None:
        assert isinstance(plan, QuarantinePlan)
        return rails(tx, plan, settings_of(config), context)

    def granted(self, tx: Transaction, plan: Plan, config: Config,
                context: RailsContext) -> Page | None:
        assert isinstance(plan, QuarantinePlan)
        return granted(tx, plan, settings_of(config), context.now, context.alertname)

    def run(self, step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        return run(step, ctx)

    def retry_delay(self, config: Config, attempts: int) -> float | None:
        """The scheduler may be away (a slurmctld restart or failover): keep trying, with
        back-off, until the scheduler's retry_until."""
        if config.scheduler is None:
            return super().retry_delay(config, attempts)
        return retry_delay(config, attempts)

    def gave_up(self, intent: Intent, attempts: int, message: str,
                config: Config) -> Page | None:
        return failure_page(intent, attempts, message)


ACTION = Quarantine()
