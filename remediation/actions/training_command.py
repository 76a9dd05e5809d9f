"""`training_command`: send a command (scale_lr, rollback, ...) to every node of a job.

The nodes are the `instance` labels of the exporters where some rank of the job still
heartbeats (`training_node_heartbeat_timestamp_seconds{training_job="<job>"}` newer than
RANK_DEPARTED_AFTER_SECONDS): an exporter whose ranks all left (a node that departed when the
job scaled down keeps their series until the job expires) holds nobody who could apply the
command. Each node's training exporter takes the command on its control API. The command id
is derived from the alert's idempotency key, so a retry or a duplicate delivery is answered
200 with the existing command instead of applying it twice; the ranks agree in-band on the
step.

A 202 only means an exporter stored the command. The step succeeds when every live rank
reporting to every node says "applied": the action polls each node until then, and fails (so
the playbook escalates) when a rank reports "failed", the command was cancelled (the job
finished first), an exporter refuses it (409: the job finished), or the step's `timeout`
(default 120 s) passes with some rank still pending. A node whose ranks departed after the
command was sent answers "departed": nothing there is waited for (the ranks that remain
apply it at their next agreement), unless every node says so.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import requests

from trainwatch.exporters.contract.catalog import LABEL_JOB
from trainwatch.exporters.contract.finite import NonFiniteError, require_finite
from trainwatch.remediation.actions.base import Action, ActionContext, ActionError, timeout_of
from trainwatch.remediation.actions.prometheus import job_instances
from trainwatch.remediation.templating import TemplateError, render

APPLY_TIMEOUT = 120.0  # seconds for every rank to apply, unless the step names a timeout
POLL_INTERVAL = 1.0


def run(step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    job = ctx.labels.get(LABEL_JOB)
    if not job:
        raise ActionError(f"training_command: alert has no {LABEL_JOB} label")
    try:
        args = render(step.get("args", {}), ctx.labels, ctx.template_config)
        require_finite(args, "args")  # the playbook was checked at load; this is what is sent
    except (TemplateError, NonFiniteError) as exc:
        raise ActionError(f"training_command: {exc}") from exc
    command = {"id": ctx.command_id(), "type": step["command"], "args": args}
    instances = job_instances(ctx, job, action="training_command")
    if not instances:
        raise ActionError(f"training_command: no training exporter has a live rank of job "
                          f"{job!r}")
    if ctx.dry_run:
        return {"would_send": command, "instances": instances}
    headers = {"Authorization": f"Bearer {ctx.config.training_exporter_token}"}
    deadline = time.monotonic() + timeout_of(step, APPLY_TIMEOUT)
    timeout = 10.0
    sent: dict[str, Any] = {}
    for instance in instances:
        scheme = ctx.config.control_api_scheme
        url = f"{scheme}://{instance}/v1/jobs/{quote(job, safe='')}/commands"
        try:
            resp = ctx.session.post(url, json=command, headers=headers, timeout=timeout)
        except requests.RequestException as exc:
            raise ActionError(f"training_command: {instance} unreachable: "
                              f"{type(exc).__name__}") from exc
        if resp.status_code not in (200, 202):
            raise ActionError(f"training_command: {instance} answered {resp.status_code}: "
                              f"{resp.text[:200]}")
        sent[instance] = resp.status_code
    ranks = wait_applied(ctx, job, command["id"], instances, headers, deadline)
    return {"command": command, "instances": sent, "ranks": ranks}


def wait_applied(ctx: ActionContext, job: str, command_id: str, instances: list[str],
                 headers: dict[str, str], deadline: float) -> dict[str, dict[str, Any]]:
    """Poll every node until all its ranks applied the command; raise on failure or deadline."""
    pending = set(instances)
    ranks: dict[str, dict[str, Any]] = {}
    last: dict[str, str] = {}
    departed: set[str] = set()
    while True:
        for instance in sorted(pending):
            scheme = ctx.config.control_api_scheme
            url = (f"{scheme}://{instance}/v1/jobs/{quote(job, safe='')}/commands/"
                   f"{quote(command_id, safe='')}")
            try:
                resp = ctx.session.get(url, headers=headers,
                                       timeout=max(1.0, min(10.0, deadline - time.monotonic())))
                body = resp.json() if resp.status_code == 200 else None
            except (requests.RequestException, ValueError) as exc:
                last[instance] = f"unreachable: {type(exc).__name__}"
                continue
            if body is None:  # e.g. the exporter restarted and the job has not reported yet
                last[instance] = f"answered {resp.status_code}"
                continue
            status = body.get("status")
            last[instance] = str(status)
            if status == "failed":
                failed = {r: s for r, s in body.get("ranks", {}).items()
                          if s.get("status") == "failed"}
                raise ActionError(f"training_command: {command_id} failed on {instance}: "
                                  f"{str(failed)[:300]}")
            if status == "cancelled":
                raise ActionError(f"training_command: {command_id} cancelled on {instance}: "
                                  f"{str(body.get('reason'))[:300]}")
            if status in ("applied", "departed"):  # departed: no live rank there to wait on
                ranks[instance] = body.get("ranks", {})
                pending.discard(instance)
                if status == "departed":
                    departed.add(instance)
        if not pending:
            if departed == set(instances):
                raise ActionError(f"training_command: every rank of job {job!r} departed "
                                  f"before applying {command_id}")
            return ranks
        if time.monotonic() >= deadline:
            raise ActionError(f"training_command: {command_id} not applied by every rank "
                              f"before the deadline: {dict(sorted(last.items()))}")
        time.sleep(POLL_INTERVAL)


class TrainingCommand(Action):
    name = "training_command"

    def run(self, step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        return run(step, ctx)


ACTION = TrainingCommand()
