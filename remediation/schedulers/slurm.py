"""Slurm through its own commands: scontrol to act, sinfo and squeue to read.

Argv only, a minimal environment (PATH, SLURM_CONF, LANG): the service's secrets never reach a
Slurm command. Every node name is checked again as a plain name here (defence in depth: the
caller took it from the inventory's mapping), because `NodeName=gpu-[01-64]` would address
64 nodes; every job id is digits as squeue printed it. Reads never use scontrol, so counting
scontrol calls counts exactly the changes Trainwatch made.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from trainwatch.remediation.config import SchedulerSettings
from trainwatch.remediation.faults import check_plain_name
from trainwatch.remediation.schedulers.base import REASON_PREFIX, Job, NodeState, SchedulerError

JOB_ID = re.compile(r"^[0-9]{1,12}$")
# What a drain reason may hold: it is one argv element, but also shown by sinfo and read by
# people and scripts; anything else is replaced.
REASON_UNSAFE = re.compile(r"[^A-Za-z0-9 ._:,()=#-]")
REASON_MAX = 200
# The states a fault leaves a batch job in: a rank died (srun's kill-on-bad-exit ends the
# job FAILED), its node failed, the OOM killer. COMPLETED is a clean end, CANCELLED a person's
# or another system's decision, TIMEOUT the job's own limit: never requeued by Trainwatch.
FAULT_ENDED = frozenset({"failed", "node_fail", "out_of_memory"})
# A job on its way to one of them: still COMPLETING, with the reason it ends for.
FAULT_ENDING_REASONS = frozenset({"nonzeroexitcode", "nodedown", "node_fail", "outofmemory"})
# The states of a job that is back in the queue or running again (someone requeued it).
QUEUED = frozenset({"pending", "configuring", "running", "requeued", "requeue_hold"})


def reason_text(text: str) -> str:
    """A drain reason Trainwatch can write: its prefix, plain characters, bounded length."""
    body = REASON_UNSAFE.sub("_", text)
    return f"{REASON_PREFIX} {body}"[:REASON_MAX]


class SlurmScheduler:
    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings

    # --- plumbing ------------------------------------------------------------------------
    def _argv(self, tool: str, *args: str) -> list[str]:
        path = (self.settings.bin_dir / tool) if self.settings.bin_dir else Path(tool)
        return [str(path), *args]

    def _env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C"}
        if self.settings.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.settings.slurm_conf)
        return env

    def _run(self, tool: str, *args: str) -> str:
        argv = self._argv(tool, *args)
        try:
            proc = subprocess.run(argv, env=self._env(), capture_output=True, text=True,
                                  timeout=self.settings.command_timeout_seconds, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SchedulerError(f"{tool} {' '.join(args[:2])}: {exc}") from exc
        if proc.returncode != 0:
            raise SchedulerError(f"{tool} {' '.join(args)} exited {proc.returncode}: "
                                 f"{(proc.stderr or proc.stdout).strip()[-500:]}")
        return proc.stdout

    # --- reads ---------------------------------------------------------------------------
    def node_states(self, nodes: tuple[str, ...]) -> dict[str, NodeState]:
        """The state of each named node (one sinfo of every node, filtered here by exact name,
        so no hostlist is ever built)."""
        out = self._run("sinfo", "--noheader", "--Node", "--format=%N|%T|%H|%E")
        states: dict[str, NodeState] = {}
        for line in out.splitlines():
            name, state, since, reason = line.split("|", 3) if line.count("|") >= 3 else (
                line, "", "", "")
            if name in nodes:
                states[name] = NodeState(name, state.strip().lower(), reason.strip(),
                                         since.strip())
        return states

    def jobs_on(self, node: str) -> list[Job]:
        """The jobs running on `node` (each once, even when several partitions list it)."""
        node = check_plain_name(node, "scheduler node")
        out = self._run("squeue", "--noheader", f"--nodelist={node}",
                        "--states=RUNNING,CONFIGURING", "--format=%i|%T|%N")
        jobs: dict[str, Job] = {}
        for line in out.splitlines():
            job_id, state, nodes = [*line.split("|"), "", ""][:3]
            if JOB_ID.match(job_id.strip()):
                jobs[job_id.strip()] = Job(job_id.strip(), state.strip().lower(), nodes.strip())
        return list(jobs.values())

    # --- changes -------------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> dict[str, Any]:
        """Drain `node` with a Trainwatch reason; `already` when it is drained by Trainwatch
        (a repeated step), an error when something else drained or downed it (not ours)."""
        node = check_plain_name(node, "scheduler node")
        current = self.node_states((node,)).get(node)
        if current is None:
            raise SchedulerError(f"slurm: node {node!r} is not known to slurmctld")
        if current.drained_by_trainwatch:
            return {"node": node, "drained": "already", "reason": current.reason}
        text = reason_text(reason)
        self._run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={text}")
        return {"node": node, "drained": True, "reason": text, "was": current.state}

    def requeue(self, job: Job) -> dict[str, Any]:
        """Requeue a running job and lift the hold Slurm puts on a requeued job (EligibleTime
        120 s later), so it restarts at once on the nodes in service."""
        if not JOB_ID.match(job.job_id):
            raise SchedulerError(f"slurm: job id {job.job_id!r} is not a Slurm job id")
        self._run("scontrol", "requeue", job.job_id)
        # The requeue completes asynchronously (the job passes through COMPLETING) and only
        # then gets its new begin time: lifting the hold earlier is overwritten.
        deadline = time.monotonic() + self.settings.command_timeout_seconds
        while True:
            state, reason = self.job_state(job.job_id)
            settled = state == "pending" and reason not in ("", "none")
            if settled or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if state != "pending":
            raise SchedulerError(f"slurm: job {job.job_id} is {state or 'gone'} after its "
                                 "requeue, not pending")
        if reason in ("begintime", "", "none"):  # held by the requeue: lift it
            self._run("scontrol", "update", f"JobId={job.job_id}", "StartTime=now")
        return {"job": job.job_id, "requeued": True, "was_on": job.nodes}

    def ended_jobs(self, node: str, job_id: str | None = None) -> list[Job]:
        """Batch jobs that ran on `node` and ended by a fault (or are ending: COMPLETING with
        a fault's reason), while slurmctld still keeps their record (MinJobAge after the end);
        only `job_id` when given (an id Slurm does not know: none)."""
        node = check_plain_name(node, "scheduler node")
        args = ["--noheader", "--states=all", f"--nodelist={node}", "--format=%i|%T|%N|%r"]
        if job_id is not None:
            if not JOB_ID.match(job_id):
                raise SchedulerError(f"slurm: job id {job_id!r} is not a Slurm job id")
            args.append(f"--jobs={job_id}")
        try:
            out = self._run("squeue", *args)
        except SchedulerError as exc:
            if job_id is not None and "Invalid job id" in str(exc):
                return []
            raise
        jobs: dict[str, Job] = {}
        for line in out.splitlines():
            fields = line.split("|")
            if len(fields) != 4 or not JOB_ID.match(fields[0].strip()):
                raise SchedulerError(f"slurm: squeue printed {line[:200]!r}, not "
                                     "id|state|nodes|reason")
            job, state, nodes, reason = (f.strip() for f in fields)
            state, reason = state.lower(), reason.lower()
            if state in FAULT_ENDED or (state == "completing"
                                        and reason in FAULT_ENDING_REASONS):
                jobs[job] = Job(job, state, nodes)
        return list(jobs.values())

    def requeue_ended(self, job: Job) -> dict[str, Any]:
        """Requeue a batch job that ended by a fault (`scontrol requeue` takes a finished
        batch job back while its record is kept) and lift the requeue's hold, so it restarts
        at once on the nodes in service (SLURM_RESTART_COUNT + 1) and resumes from its newest
        committed checkpoint. A job that ended otherwise (COMPLETED, CANCELLED, TIMEOUT) is
        refused; one already back in the queue is left as it is (`already`). Read back: the
        job must be queued without the hold, or running."""
        if not JOB_ID.match(job.job_id):
            raise SchedulerError(f"slurm: job id {job.job_id!r} is not a Slurm job id")
        deadline = time.monotonic() + self.settings.command_timeout_seconds
        state, reason = self._settled_state(job.job_id, deadline)
        if state in QUEUED:
            return {"job": job.job_id, "requeued": "already", "state": state}
        if state not in FAULT_ENDED:
            raise SchedulerError(f"slurm: job {job.job_id} is {state or 'gone'} ({reason}), "
                                 "not ended by a fault: not requeued")
        self._run("scontrol", "requeue", job.job_id)
        # The requeue goes through asynchronously: the job is PENDING at once, with the old
        # reason and then none, and only later gets the hold (its new begin time, 120 s on).
        # Lifting it before it is set is overwritten, so wait for it (or for a start).
        while time.monotonic() < deadline:
            state, reason = self._any_state(job.job_id)
            if state in ("running", "configuring") or (state == "pending"
                                                       and reason == "begintime"):
                break
            time.sleep(0.1)
        if state == "pending" and reason == "begintime":
            self._run("scontrol", "update", f"JobId={job.job_id}", "StartTime=now")
            state, reason = self._any_state(job.job_id)
        if state not in QUEUED or reason == "begintime":
            raise SchedulerError(f"slurm: job {job.job_id} is {state or 'gone'} ({reason}) "
                                 "after its requeue, not queued to start now")
        return {"job": job.job_id, "requeued": True, "was": "ended", "ended_on": job.nodes,
                "state": state}

    def _settled_state(self, job_id: str, deadline: float) -> tuple[str, str]:
        """The job's state once it is no longer COMPLETING (its ranks are still being
        cleaned up), or COMPLETING at the deadline."""
        while True:
            state, reason = self._any_state(job_id)
            if state != "completing" or time.monotonic() > deadline:
                return state, reason
            time.sleep(0.1)

    def _any_state(self, job_id: str) -> tuple[str, str]:
        """(state, reason) of a job in any state, ended ones included while slurmctld keeps
        their record; ("", "") once it is gone."""
        out = self._run("squeue", "--noheader", "--states=all", f"--jobs={job_id}",
                        "--format=%T|%r")
        state, _, reason = out.strip().partition("|")
        return state.strip().lower(), reason.strip().lower()

    def job_state(self, job_id: str) -> tuple[str, str]:
        """(state, reason) of a job, lower case; ("", "") when squeue no longer lists it."""
        out = self._run("squeue", "--noheader", f"--jobs={job_id}", "--format=%T|%r")
        state, _, reason = out.strip().partition("|")
        return state.strip().lower(), reason.strip().lower()

    def resume(self, node: str) -> dict[str, Any]:
        """Return a node Trainwatch drained to service (never one drained for another
        reason: that is a human's or Slurm's decision)."""
        node = check_plain_name(node, "scheduler node")
        current = self.node_states((node,)).get(node)
        if current is None:
            raise SchedulerError(f"slurm: node {node!r} is not known to slurmctld")
        if "drain" not in current.state:
            return {"node": node, "resumed": "already", "state": current.state}
        if not current.drained_by_trainwatch:
            raise SchedulerError(f"slurm: node {node!r} was drained by someone else "
                                 f"({current.reason!r}); Trainwatch leaves it to them")
        self._run("scontrol", "update", f"NodeName={node}", "State=RESUME")
        return {"node": node, "resumed": True, "was": current.state}
