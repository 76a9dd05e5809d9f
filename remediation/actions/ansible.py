"""`ansible`: run a playbook of the trainwatch.stack collection (ansible/playbooks/remediation/,
copied to the configured ansible_playbooks_dir) through ansible-runner, on exactly the
inventory hosts the alert names.

No shell anywhere: ansible-runner execs ansible-playbook with an argv; the alert's labels
arrive as extra vars (already allowlisted). The target is never a host pattern: the `node`
label (or each node of the job) must name exactly one host of the configured inventory
(trainwatch.remediation.inventory), so `all`, a group or `a:b` is refused before anything runs. Only
files directly inside the configured ansible_playbooks_dir can be run.

Under the hardened unit the service's home is read-only, so every file ansible-runner and
Ansible write (the run's private data dir, ANSIBLE_HOME, local temp) lives under the state
directory next to the store (ReadWritePaths). The child gets a minimal environment built here,
never the service's own: secrets a container or unit puts in the environment stay out of
Ansible and every module it runs.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ansible_runner

from trainwatch.exporters.contract.catalog import LABEL_JOB, LABEL_NODE
from trainwatch.remediation.actions.base import Action, ActionContext, ActionError, timeout_of
from trainwatch.remediation.actions.prometheus import job_instances
from trainwatch.remediation.config import Config
from trainwatch.remediation.inventory import TargetError, resolve_hosts
from trainwatch.remediation.templating import TemplateError, render

OUTPUT_LIMIT = 20000
# hosts_from: job_nodes takes every node where a rank of the job heartbeated this recently, not
# only those heartbeating now: a stalled job's stopped or hung rank stops heartbeating, and its
# node is the one its diagnostics need most (the exporter keeps a silent rank's series until
# the job expires)
JOB_NODES_WITHIN_SECONDS = 600.0
# What an ansible-playbook child may inherit from the service's environment: locale, time zone,
# identity, an ssh agent, the service's Python path (tools run with its interpreter must import
# the same code) and Ansible's own settings. Everything else (tokens included) stays out.
INHERITED_ENV = frozenset({"HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "USER",
                           "LOGNAME", "SSH_AUTH_SOCK", "PYTHONPATH"})
INHERITED_PREFIXES = ("ANSIBLE_",)


def playbook_path(ctx: ActionContext, name: str) -> Path:
    root = ctx.config.ansible_playbooks_dir.resolve()
    path = (root / name).resolve()
    if path.parent != root or not path.is_file():
        raise ActionError(f"ansible: playbook {name!r} is not in {root}")
    return path


def state_dir(config: Config) -> Path:
    """Where ansible-runner and Ansible write: beside the store, the service's writable state."""
    return config.store_path.parent / "ansible"


def check(step: dict[str, Any], labels: Mapping[str, str], config: Config) -> None:
    """Before anything is granted: the alert's node must be exactly one inventory host.

    Raises TargetError (a LabelError: the engine refuses and audits it, no retry). Steps whose
    hosts come from Prometheus (hosts_from: job_nodes) are checked when they run.
    """
    if step.get("hosts_from") == "job_nodes":
        return
    node = labels.get(LABEL_NODE)
    if not node:
        raise TargetError(f"ansible: alert has no {LABEL_NODE} label to target")
    resolve_hosts(config.ansible_inventory, [node], state_dir(config))


def _targets(step: dict[str, Any], ctx: ActionContext) -> list[str]:
    """The hosts to run on: the alert's node, or every node of the job (from Prometheus),
    each resolved to exactly one inventory host."""
    if step.get("hosts_from") == "job_nodes":
        job = ctx.labels.get(LABEL_JOB)
        if not job:
            raise ActionError(f"ansible: alert has no {LABEL_JOB} label to find the job's nodes")
        names = sorted({instance.rsplit(":", 1)[0].strip("[]")
                        for instance in job_instances(ctx, job, action="ansible",
                                                      within=JOB_NODES_WITHIN_SECONDS)})
        if not names:
            raise ActionError(f"ansible: no node reports job {job!r}")
    else:
        node = ctx.labels.get(LABEL_NODE)
        if not node:
            raise ActionError(f"ansible: alert has no {LABEL_NODE} label to target")
        names = [node]
    try:
        return resolve_hosts(ctx.config.ansible_inventory, names, state_dir(ctx.config))
    except TargetError as exc:
        raise ActionError(f"ansible: {exc}") from exc


def child_env(state: Path, parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of ansible-playbook: an allowlist of the parent's, plus writable
    Ansible directories under `state` and the service's own virtualenv on PATH."""
    parent = os.environ if parent is None else parent
    env = {k: v for k, v in parent.items()
           if k in INHERITED_ENV or k.startswith(INHERITED_PREFIXES)}
    env.update({
        # ansible-playbook comes with the service's own environment (a dependency)
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{parent.get('PATH', os.defpath)}",
        "ANSIBLE_HOME": str(state / "home"),
        "ANSIBLE_LOCAL_TEMP": str(state / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
    })
    return env


def run(step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    path = playbook_path(ctx, step["playbook"])
    hosts = _targets(step, ctx)
    limit = ":".join(hosts)  # verified names only: each selects itself, the union exactly them
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
    state = state_dir(ctx.config)
    for sub in ("runs", "home", "tmp"):
        (state / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="run-", dir=state / "runs") as tmp:
        runner = ansible_runner.interface.init_runner(
            private_data_dir=tmp, playbook=str(path), limit=limit,
            inventory=str(ctx.config.ansible_inventory), extravars=extravars, quiet=True,
            timeout=int(timeout_of(step, ctx.config.action_timeout_seconds)))
        # ansible-runner seeds the child's environment with the whole of os.environ: replace
        # it, keeping only what runner itself set (its callback plugin and event settings).
        runner.config.env = {**child_env(state), **{
            k: v for k, v in runner.config.env.items()
            if k not in os.environ or os.environ[k] != v}}
        runner.run()
        # events and stats live in the private data dir: read them before it is removed
        output = runner.stdout.read() if runner.stdout else ""
        captured, by_host = _registered_output(runner)
        processed = set((runner.stats or {}).get("processed") or {})
    result = {"playbook": path.name, "limit": limit, "status": runner.status, "rc": runner.rc,
              "output_tail": output[-OUTPUT_LIMIT:], "captured": captured,
              "captured_by_host": by_host}
    if runner.status != "successful" or runner.rc != 0:
        raise ActionError(f"ansible: {path.name} on {limit} ended {runner.status} "
                          f"rc={runner.rc}: {output[-1500:]}")
    missing = [host for host in hosts if host not in processed]
    if missing:
        raise ActionError(f"ansible: {path.name}: did not run on {missing!r}")
    return result


def _registered_output(runner: Any) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """stdout of tasks named `Capture: ...` (e.g. a py-spy dump), for the audit record: by
    task (one host's, as before), and by host and task (every host's: a stalled job's
    quarantine reads each node's diagnostics)."""
    captured: dict[str, Any] = {}
    by_host: dict[str, dict[str, str]] = {}
    for event in runner.events:
        if event.get("event") != "runner_on_ok":
            continue
        data = event.get("event_data", {})
        if not str(data.get("task", "")).lower().startswith("capture"):
            continue
        res = data.get("res", {})
        task = data.get("task", "task")
        captured[task] = str(res.get("stdout", ""))[-OUTPUT_LIMIT:]
        by_host.setdefault(str(data.get("host", "")), {})[task] = captured[task]
    return captured, by_host


class Ansible(Action):
    name = "ansible"

    def check(self, step: dict[str, Any], labels: Mapping[str, str], config: Config) -> None:
        check(step, labels, config)

    def run(self, step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        return run(step, ctx)


ACTION = Ansible()
