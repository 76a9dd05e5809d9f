"""`ansible`: run a playbook from ansible/remediation/ through ansible-runner, --limit the node.

No shell anywhere: ansible-runner execs ansible-playbook with an argv; the alert's labels
arrive as extra vars (already allowlisted) and the limit is the validated `node` label. Only
files directly inside the configured ansible_playbooks_dir can be run.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import ansible_runner

from exporters.catalog import LABEL_JOB, LABEL_NODE
from remediation.actions.base import ActionContext, ActionError, timeout_of
from remediation.actions.training_command import job_instances
from remediation.templating import TemplateError, render

OUTPUT_LIMIT = 20000


def playbook_path(ctx: ActionContext, name: str) -> Path:
    root = ctx.config.ansible_playbooks_dir.resolve()
    path = (root / name).resolve()
    if path.parent != root or not path.is_file():
        raise ActionError(f"ansible: playbook {name!r} is not in {root}")
    return path


def _limit(step: dict[str, Any], ctx: ActionContext) -> str:
    """The --limit pattern: the alert's node, or every node of the job (from Prometheus)."""
    if step.get("hosts_from") == "job_nodes":
        job = ctx.labels.get(LABEL_JOB)
        if not job:
            raise ActionError(f"ansible: alert has no {LABEL_JOB} label to find the job's nodes")
        nodes = sorted({instance.rsplit(":", 1)[0].strip("[]")
                        for instance in job_instances(ctx, job)})
        if not nodes:
            raise ActionError(f"ansible: no node reports job {job!r}")
        return ":".join(nodes)
    node = ctx.labels.get(LABEL_NODE)
    if not node:
        raise ActionError(f"ansible: alert has no {LABEL_NODE} label to --limit the run to")
    return node


def run(step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    path = playbook_path(ctx, step["playbook"])
    node = _limit(step, ctx)
    try:
        step_vars = render(step.get("vars", {}), ctx.labels, ctx.template_config)
    except TemplateError as exc:
        raise ActionError(f"ansible: {exc}") from exc
    extravars = {
        **step_vars,
        "trainwatch_labels": dict(ctx.labels),
        "trainwatch_dry_run": ctx.dry_run,
        "trainwatch_command_id": ctx.command_id(),
    }
    inventory = ctx.config.ansible_inventory
    with tempfile.TemporaryDirectory(prefix="trainwatch-ansible-") as tmp:
        kwargs: dict[str, Any] = {
            "private_data_dir": tmp,
            "playbook": str(path),
            "limit": node,
            "extravars": extravars,
            "quiet": True,
            "timeout": int(timeout_of(step, ctx.config.action_timeout_seconds)),
            # ansible-playbook comes with the service's own environment (a dependency)
            "envvars": {"PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                f"{os.environ.get('PATH', os.defpath)}",
                        "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0"},
        }
        if inventory is not None:
            kwargs["inventory"] = str(inventory)
        runner = ansible_runner.run(**kwargs)
        # events and stats live in the private data dir: read them before it is removed
        output = runner.stdout.read() if runner.stdout else ""
        captured = _registered_output(runner)
        processed = set((runner.stats or {}).get("processed") or {})
    result = {"playbook": path.name, "limit": node, "status": runner.status, "rc": runner.rc,
              "output_tail": output[-OUTPUT_LIMIT:], "captured": captured}
    if runner.status != "successful" or runner.rc != 0:
        raise ActionError(f"ansible: {path.name} on {node} ended {runner.status} rc={runner.rc}: "
                          f"{output[-1500:]}")
    missing = [host for host in node.split(":") if host not in processed]
    if missing:
        raise ActionError(f"ansible: {path.name}: no inventory host named {missing!r}")
    return result


def _registered_output(runner: Any) -> dict[str, Any]:
    """stdout of tasks named `Capture: ...` (e.g. a py-spy dump), for the audit record."""
    captured: dict[str, Any] = {}
    for event in runner.events:
        if event.get("event") != "runner_on_ok":
            continue
        data = event.get("event_data", {})
        if not str(data.get("task", "")).lower().startswith("capture"):
            continue
        res = data.get("res", {})
        captured[data.get("task", "task")] = str(res.get("stdout", ""))[-OUTPUT_LIMIT:]
    return captured
