"""`trainwatch-resume-node --config F HOST`: return a node Trainwatch drained to the scheduler,
only after its health check passes.

A node never comes back because an alert resolved: a lost GPU stops being scraped, so its
alert resolves by itself while the GPU is still gone. This explicit command, run by a person
or a scheduled job on the remediation host, is the only way back, and it refuses unless

1. HOST is one inventory host of the scheduler node mapping (no pattern, no hostlist),
2. its node is drained, by Trainwatch: its reason, read from the scheduler, is one Trainwatch
   writes (`trainwatch: ... intent <id>`). A node drained, down or reserved by a person or by
   Slurm is theirs: refused, audited `node_not_ours` and paged, and checked again right before
   the resume (the health check takes a while),
3. it is not kept out as a lemon (quarantined `lemon_faults` times inside the window,
   trainwatch.remediation.actions.quarantine.kept_out),
4. Prometheus saw no XID on that node since the drain (the exporter's XID counter; NVML keeps
   no history),
5. the node_health_check Ansible playbook passes on exactly that host (NVML state of every
   GPU, pending or failed row remaps, uncorrectable ECC; a short burn and all-reduce where
   there is CUDA).

Every outcome is written to the audit (decision `node_resumed`, `node_resume_refused` or
`node_not_ours`); a
resume ends the node's quarantine grant in the same transaction, so its next fault drains it
again at once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from trainwatch.exporters import add_version_argument
from trainwatch.exporters.contract import catalog
from trainwatch.remediation.actions import ansible as ansible_action
from trainwatch.remediation.actions import quarantine as quarantine_action
from trainwatch.remediation.actions.base import ActionContext, ActionError
from trainwatch.remediation.actions.prometheus import PrometheusError, instant_query
from trainwatch.remediation.config import Config, ConfigError, load_config
from trainwatch.remediation.decisions import Decision
from trainwatch.remediation.faults import NodeMap
from trainwatch.remediation.labels import LabelError
from trainwatch.remediation.outgoing import CallFailed, call
from trainwatch.remediation.pager import Page
from trainwatch.remediation.schedulers import for_config
from trainwatch.remediation.schedulers.base import NodeNotOurs, SchedulerError
from trainwatch.remediation.stores import open_store

HEALTH_PLAYBOOK = "node_health_check.yml"


class ResumeRefused(RuntimeError):
    """The node stays out of service; the message says why (and goes into the audit)."""


class NotOurs(ResumeRefused):
    """Someone else has the node out of service: refused, and the on-call is paged."""


def drained_since(since: str, now: float) -> float:
    """Seconds since Slurm recorded the drain reason (sinfo %H, local time), at least 1."""
    try:
        at = datetime.fromisoformat(since).timestamp()
    except ValueError as exc:
        raise ResumeRefused(f"cannot read the drain time {since!r}") from exc
    return max(now - at, 1.0)


def xids_since(config: Config, host: str, seconds: float) -> list[dict[str, Any]]:
    """The XIDs Prometheus counted on `host` in the last `seconds` (fail closed: no answer
    from Prometheus refuses the resume)."""
    window = f"{int(seconds) + 1}s"
    series = catalog.GPU_XID_ERRORS
    # a counter that rose in the window, or was born in it (increase() needs two samples;
    # the same expression as the GpuXidErrors alert, alert_rules.promql.new_events)
    expr = f"(increase({series}[{window}]) > 0) or ({series} > 0 unless {series} offset {window})"
    try:
        result = instant_query(requests, config.prometheus_url, expr,
                               timeout=config.request_timeout_seconds)
    except PrometheusError as exc:
        raise ResumeRefused(f"Prometheus cannot say whether {host} had XIDs since the drain: "
                            f"{exc}") from exc
    return [{"gpu": r["metric"].get("gpu"), "xid": r["metric"].get("xid")}
            for r in result if _node_of(r["metric"]) == host]


def _node_of(labels: dict[str, str]) -> str:
    """The series' node: its `node` label, else the host part of `instance` (as the alert
    rules' with_node does)."""
    return labels.get("node") or labels.get("instance", "").rsplit(":", 1)[0].strip("[]")


def resume_node(config: Config, host: str) -> dict[str, Any]:
    """Check, then resume; ResumeRefused (node left drained) with the reason otherwise."""
    try:
        nodes = NodeMap.from_inventory(config.ansible_inventory,
                                       ansible_action.state_dir(config))
        node = nodes.node_for(host, "host")
    except LabelError as exc:
        raise ResumeRefused(str(exc)) from exc
    scheduler = for_config(config)
    state = scheduler.node_states((node,)).get(node)
    if state is None:
        raise ResumeRefused(f"{node} is not known to the scheduler")
    if "drain" not in state.state:
        raise ResumeRefused(f"{node} is {state.state}, not drained: nothing to resume")
    if not state.drained_by_trainwatch:
        raise NotOurs(f"{node} is {state.state} by someone else ({state.reason!r}); "
                      "Trainwatch leaves it to them")
    report: dict[str, Any] = {"host": host, "node": node, "drain_reason": state.reason}
    if config.scheduler is not None:
        store = open_store(config)
        try:
            with store.transaction() as tx:
                why = quarantine_action.kept_out(tx, node, config.scheduler, tx.now)
        finally:
            store.close()
        if why is not None:
            raise ResumeRefused(why)
    xids = xids_since(config, host, drained_since(state.since, time.time()))
    report["xids_since_drain"] = xids
    if xids:
        raise ResumeRefused(f"{host} reported XIDs since the drain: {xids}")
    ctx = ActionContext(config=config, labels={"node": host}, session=requests.Session(),
                        idempotency_key=f"resume|{node}|{time.time()}")
    try:
        health = ansible_action.run({"action": "ansible", "playbook": HEALTH_PLAYBOOK}, ctx)
    except ActionError as exc:
        raise ResumeRefused(f"node_health_check failed on {host}: {exc}") from exc
    report["health_check"] = health.get("captured", {})
    try:  # the adapter reads the owner again: a person may have taken the node meanwhile
        report["resume"] = scheduler.resume(node)
    except NodeNotOurs as exc:
        raise NotOurs(str(exc)) from exc
    return report


def _page(config: Config, host: str, reason: str) -> None:
    """Tell the on-call that a node someone else has out of service was asked back (one
    deadline for the whole call, trainwatch.remediation.outgoing)."""
    if not config.pager_url:
        return
    page = Page(Decision.NODE_NOT_OURS, None, "", f"trainwatch-resume-node {host} refused: "
                f"{reason}", {"host": host})
    try:
        answer = call("POST", config.pager_url, json_body=page.body(),
                      deadline_seconds=config.request_timeout_seconds)
    except CallFailed as exc:
        print(f"trainwatch-resume-node: paging failed: {exc}", file=sys.stderr)
        return
    if answer.status >= 300:
        print(f"trainwatch-resume-node: paging failed: the pager answered {answer.status}",
              file=sys.stderr)


def _audit(config: Config, decision: str, host: str, reason: str, detail: Any,
           resumed_node: str | None = None) -> None:
    store = open_store(config)
    try:
        with store.transaction() as tx:
            if resumed_node is not None:
                quarantine_action.end_quarantine(tx, resumed_node, tx.now)
            tx.audit(decision, playbook="node_health_check", target_key=host,
                     action="resume_node", reason=reason[:4000], detail=detail)
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainwatch-resume-node", description=(
        "Return a node Trainwatch drained to the scheduler after its health check passes."))
    add_version_argument(parser)
    parser.add_argument("--config", required=True, type=Path, help="the service's config")
    parser.add_argument("host", help="the inventory host (not a pattern, not a hostlist)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"trainwatch-resume-node: {exc}", file=sys.stderr)
        return 2
    try:
        report = resume_node(config, args.host)
    except (ResumeRefused, SchedulerError) as exc:
        not_ours = isinstance(exc, NotOurs)
        _audit(config, Decision.NODE_NOT_OURS if not_ours else Decision.NODE_RESUME_REFUSED,
               args.host,
               str(exc), {"host": args.host})
        if not_ours:
            _page(config, args.host, str(exc))
        print(json.dumps({"resumed": False, "reason": str(exc)}))
        return 1
    _audit(config, Decision.NODE_RESUMED, args.host, "health check passed; node resumed", report,
           resumed_node=report["node"])
    print(json.dumps({"resumed": True, **report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
