"""Slurm through its own commands: scontrol to act, sinfo and squeue to read.

Argv only, a minimal environment (PATH, SLURM_CONF, LANG): the service's secrets never reach a
Slurm command. Every node name is checked again as a plain name here (defence in depth: the
caller took it from the inventory's mapping), because `NodeName=gpu-[01-64]` would address
64 nodes; every job id is digits as squeue printed it. Reads never use scontrol, so counting
scontrol calls counts exactly the changes Trainwatch made.

Nothing is believed unchecked. Every read asks for a header and parses strictly: output
without the header line, or a line that does not parse, is a SchedulerError (a wrapper that
printed garbage with exit status 0 is a failure, and empty squeue output without its header
is not "no jobs"). Every change is read back: after a drain the node's state and reason,
after a requeue the job's state, after a resume the node's state; a job a fault already
ended (ended_jobs, requeue_ended) is read and requeued by the same rules.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from trainwatch.remediation.config import SchedulerSettings
from trainwatch.remediation.faults import check_plain_name
from trainwatch.remediation.schedulers.base import (
    REASON_PREFIX,
    Job,
    NodeNotOurs,
    NodeState,
    SchedulerError,
    own_reason,
)

# A job (digits) or an array task (`123_4`), as squeue's %i prints them.
JOB_ID = re.compile(r"^[0-9]{1,12}(_[0-9]{1,9})?$")
# A long state as sinfo's %T and squeue's %T print it: lower-case words, `_`, and Slurm's flags.
STATE_WORD = re.compile(r"^[a-z_]+[*$~#!%@^+-]*$")
# What a drain reason may hold: it is one argv element, but also shown by sinfo and read by
# people and scripts; anything else is replaced.
REASON_UNSAFE = re.compile(r"[^A-Za-z0-9 ._:,()=#-]")
REASON_MAX = 200
# How long a change may take to show in a read-back (slurmctld applies a requeue's hold and a
# StartTime asynchronously); past it the change did not happen.
READ_BACK_SECONDS = 10.0
# Slurm stamps a revoked credential in whole seconds; a job restarted within the second of its
# requeue is killed as non-startable. A little over a second covers the rounding.
CREDENTIAL_REVOKE_SECONDS = 1.2
NODE_FORMAT = ("%N|%T|%H|%E", "NODELIST|STATE|TIMESTAMP|REASON")
JOBS_FORMAT = ("%i|%T|%N", "JOBID|STATE|NODELIST")
# squeue --Format (-O), each field ended by `|`: the begin time has no %-letter.
JOB_STATE_FORMAT = ("State:|,Reason:|,EligibleTime:", "STATE|REASON|ELIGIBLE_TIME")
# A requeued batch job gets a begin time of about 121 s ahead (the credential's lifetime) when
# its requeue completes; squeue shows the reason BeginTime only after a later scheduling pass
# (27 s in one run, long enough in another that the watch gave up and the job waited out the
# hold: 132 s). A begin time this far ahead is that hold, read at once.
HOLD_AHEAD_SECONDS = 5.0
# A job that ran on a node, ended ones included (ended_jobs): id, state, nodes, why it ends.
ENDED_FORMAT = ("%i|%T|%N|%r", "JOBID|STATE|NODELIST|REASON")
T = TypeVar("T")
# The states a fault leaves a batch job in: a rank died (srun's kill-on-bad-exit ends the
# job FAILED), its node failed, the OOM killer. COMPLETED is a clean end, CANCELLED a person's
# or another system's decision, TIMEOUT the job's own limit: never requeued by Trainwatch.
FAULT_ENDED = frozenset({"failed", "node_fail", "out_of_memory"})
# A job on its way to one of them: still COMPLETING, with the reason it ends for.
FAULT_ENDING_REASONS = frozenset({"nonzeroexitcode", "nodedown", "node_fail", "outofmemory"})
# The states of a job that is back in the queue or running again (someone requeued it).
QUEUED = frozenset({"pending", "configuring", "running", "requeued", "requeue_hold"})


def reason_text(text: str) -> str:
    """A drain reason Trainwatch can write: its prefix, plain characters, bounded length; it
    must name the intent (`intent <id>`), or Trainwatch could not tell the drain is its own."""
    body = REASON_UNSAFE.sub("_", text)
    reason = f"{REASON_PREFIX} {body}"[:REASON_MAX]
    if own_reason(reason) is None:
        raise SchedulerError(f"slurm: drain reason {reason!r} names no intent (`intent <id>`):"
                             " Trainwatch could not recognise the drain as its own")
    return reason


def parse_table(out: str, header: str, fields: int, what: str) -> list[list[str]]:
    """The rows of a `|`-separated table under its exact header line; SchedulerError for
    anything else (no header, a row with another number of fields)."""
    lines = out.splitlines()
    if not lines or lines[0].strip() != header:
        raise SchedulerError(f"{what}: unparseable answer (expected the header {header!r}): "
                             f"{out.strip()[:300]!r}")
    rows = []
    for line in lines[1:]:
        cells = line.split("|", fields - 1)
        if len(cells) != fields:
            raise SchedulerError(f"{what}: unparseable line {line[:300]!r}")
        rows.append([c.strip() for c in cells])
    return rows


class JobRow(NamedTuple):
    """One job as squeue shows it: state and reason (lower case), and when it may start (a
    Unix time; None when Slurm prints none)."""

    state: str
    reason: str
    eligible: float | None

    def held(self, now: float) -> bool:
        """Pending behind a begin time well ahead of `now`; the reason BeginTime only where
        Slurm prints no begin time (the reason lags a lift as it lags the hold)."""
        if self.state != "pending":
            return False
        if self.eligible is not None:
            return self.eligible > now + HOLD_AHEAD_SECONDS
        return self.reason == "begintime"


def slurm_time(value: str) -> float | None:
    """A time as squeue prints it (ISO 8601 in the local zone: the reads run without
    SLURM_TIME_FORMAT) as a Unix time; None for Slurm's words for none (Unknown, N/A, None)."""
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        if value.lower() in ("unknown", "n/a", "none", ""):
            return None
        raise SchedulerError(f"squeue: unparseable time {value[:100]!r}") from None


def _state_word(value: str, what: str) -> str:
    state = value.lower()
    if not STATE_WORD.match(state):
        raise SchedulerError(f"{what}: unparseable state {value[:100]!r}")
    return state


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

    def _read_back(self, read: Callable[[], T], done: Callable[[T], bool]) -> T:
        """Read until `done` holds or READ_BACK_SECONDS pass; the last reading either way."""
        deadline = time.monotonic() + min(READ_BACK_SECONDS,
                                          self.settings.command_timeout_seconds)
        while True:
            value = read()
            if done(value) or time.monotonic() > deadline:
                return value
            time.sleep(0.1)

    # --- reads ---------------------------------------------------------------------------
    def node_states(self, nodes: tuple[str, ...]) -> dict[str, NodeState]:
        """The state of each named node (one sinfo of every node, filtered here by exact name,
        so no hostlist is ever built). A node sinfo does not list is absent."""
        fmt, header = NODE_FORMAT
        out = self._run("sinfo", "--Node", f"--format={fmt}")
        states: dict[str, NodeState] = {}
        for name, state, since, reason in parse_table(out, header, 4, "sinfo"):
            if name in nodes:
                states[name] = NodeState(name, _state_word(state, "sinfo"), reason, since)
        return states

    def node_state(self, node: str) -> NodeState:
        """One node's state; SchedulerError when slurmctld does not know it."""
        node = check_plain_name(node, "scheduler node")
        current = self.node_states((node,)).get(node)
        if current is None:
            raise SchedulerError(f"slurm: node {node!r} is not known to slurmctld")
        return current

    def jobs_on(self, node: str) -> list[Job]:
        """The jobs running on `node` (each once, even when several partitions list it)."""
        return self._jobs_in(node, "RUNNING,CONFIGURING")

    def completing_jobs(self, node: str) -> list[Job]:
        """The jobs ending on `node` now (COMPLETING: their epilog runs; a fault's exit code
        is not their reason yet)."""
        return self._jobs_in(node, "COMPLETING")

    def _jobs_in(self, node: str, states: str) -> list[Job]:
        node = check_plain_name(node, "scheduler node")
        fmt, header = JOBS_FORMAT
        out = self._run("squeue", f"--nodelist={node}", f"--states={states}",
                        f"--format={fmt}")
        jobs: dict[str, Job] = {}
        for job_id, state, nodes in parse_table(out, header, 3, "squeue"):
            if not JOB_ID.match(job_id):
                raise SchedulerError(f"squeue: unparseable job id {job_id[:100]!r}")
            jobs[job_id] = Job(job_id, _state_word(state, "squeue"), nodes)
        return list(jobs.values())

    def job_state(self, job_id: str) -> tuple[str, str]:
        """(state, reason) of a job, lower case; ("", "") when squeue no longer lists it."""
        return self._job_row(job_id)[:2]

    def _job_row(self, job_id: str, *states: str) -> JobRow:
        """One job under JOB_STATE_FORMAT's header; ("", "", None) when squeue lists no such
        job (a job id slurmctld no longer knows included)."""
        if not JOB_ID.match(job_id):
            raise SchedulerError(f"slurm: job id {job_id!r} is not a Slurm job id")
        fmt, header = JOB_STATE_FORMAT
        try:
            out = self._run("squeue", *states, f"--jobs={job_id}", f"--Format={fmt}")
        except SchedulerError as exc:
            if "Invalid job id" in str(exc):
                return JobRow("", "", None)
            raise
        rows = parse_table(out, header, 3, "squeue")
        if not rows:
            return JobRow("", "", None)
        if len(rows) > 1:
            raise SchedulerError(f"squeue: {len(rows)} lines for job {job_id}")
        state, reason, eligible = rows[0]
        return JobRow(_state_word(state, "squeue"), reason.lower(), slurm_time(eligible))

    # --- changes -------------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> dict[str, Any]:
        """Drain `node` with a Trainwatch reason, read back. `already` when Trainwatch drained
        it (a repeated step); NodeNotOurs when someone else has it out of service (drained,
        down, reserved: never overwritten); SchedulerError when the drain does not read back
        (another reason won a race, or the command did nothing)."""
        current = self.node_state(node)
        if current.drained_by_trainwatch:
            return {"node": node, "drained": "already", "reason": current.reason}
        if current.someone_elses:
            raise NodeNotOurs(f"slurm: node {node!r} is {current.state} by someone else "
                              f"({current.reason!r}); Trainwatch leaves it to them")
        text = reason_text(reason)
        self._run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={text}")
        after = self._read_back(lambda: self.node_state(node),
                                lambda s: "drain" in s.state and s.reason == text)
        if "drain" not in after.state or after.reason != text:
            raise SchedulerError(f"slurm: node {node!r} reads back {after.state} with reason "
                                 f"{after.reason!r} after the drain, not drained with "
                                 f"{text!r}")
        return {"node": node, "drained": True, "reason": text, "was": current.state,
                "now": after.state}

    def requeue(self, job: Job) -> dict[str, Any]:
        """Requeue a running job and lift the hold Slurm puts on a requeued job (EligibleTime
        120 s later), so it restarts at once on the nodes in service; both read back."""
        if not JOB_ID.match(job.job_id):
            raise SchedulerError(f"slurm: job id {job.job_id!r} is not a Slurm job id")
        self._run("scontrol", "requeue", job.job_id)
        requeued = time.monotonic()
        # The requeue completes asynchronously (the job passes through COMPLETING) and only
        # then gets its hold (a begin time ahead): lifting it earlier is overwritten.
        row = self._read_back(
            lambda: self._job_row(job.job_id),
            lambda r: r.held(time.time()) or (r.state == "pending"
                                              and r.reason not in ("", "none")))
        if row.state != "pending":
            raise SchedulerError(f"slurm: job {job.job_id} is {row.state or 'gone'} after its "
                                 "requeue, not pending")
        if row.held(time.time()) or row.reason in ("", "none"):  # held by the requeue: lift it
            self._lift(job.job_id, requeued)
            row = self._read_back(lambda: self._job_row(job.job_id),
                                  lambda r: not r.held(time.time()))
            if row.held(time.time()):
                raise SchedulerError(f"slurm: job {job.job_id} is still held (BeginTime) "
                                     "after StartTime=now")
        return {"job": job.job_id, "requeued": True, "was_on": job.nodes,
                "now": [row.state, row.reason]}

    def ended_jobs(self, node: str, job_id: str | None = None) -> list[Job]:
        """Batch jobs that ran on `node` and ended by a fault (or are ending: COMPLETING with
        a fault's reason), while slurmctld still keeps their record (MinJobAge after the end);
        only `job_id` when given (an id Slurm does not know: none). Parsed under its header
        like every read."""
        node = check_plain_name(node, "scheduler node")
        fmt, header = ENDED_FORMAT
        args = ["--states=all", f"--nodelist={node}", f"--format={fmt}"]
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
        for job, state, nodes, reason in parse_table(out, header, 4, "squeue"):
            if not JOB_ID.match(job):
                raise SchedulerError(f"squeue: unparseable job id {job[:100]!r}")
            state, reason = _state_word(state, "squeue"), reason.lower()
            if state in FAULT_ENDED or (state == "completing"
                                        and reason in FAULT_ENDING_REASONS):
                jobs[job] = Job(job, state, nodes)
        return list(jobs.values())

    def requeue_ended(self, job: Job) -> dict[str, Any]:
        """Requeue a batch job that ended by a fault (`scontrol requeue` takes a finished
        batch job back while its record is kept) and lift the requeue's hold, so it restarts
        at once on the nodes in service (SLURM_RESTART_COUNT + 1) and resumes from its newest
        committed checkpoint. A job that ended otherwise (COMPLETED, CANCELLED, TIMEOUT) is
        refused; one already back in the queue (someone requeued or held it) is left as it
        is (`already`). Read back: the job must be queued without the hold, or running."""
        if not JOB_ID.match(job.job_id):
            raise SchedulerError(f"slurm: job id {job.job_id!r} is not a Slurm job id")
        deadline = time.monotonic() + self.settings.command_timeout_seconds
        state, reason, _ = self._settled_state(job.job_id, deadline)
        if state in QUEUED:
            return {"job": job.job_id, "requeued": "already", "state": state}
        if state not in FAULT_ENDED:
            raise SchedulerError(f"slurm: job {job.job_id} is {state or 'gone'} ({reason}), "
                                 "not ended by a fault: not requeued")
        self._run("scontrol", "requeue", job.job_id)
        requeued = time.monotonic()
        row = self._lift_requeue_hold(job.job_id, requeued)
        if row.state not in QUEUED or row.held(time.time()):
            raise SchedulerError(f"slurm: job {job.job_id} is {row.state or 'gone'} "
                                 f"({row.reason}) after its requeue, not queued to start now")
        return {"job": job.job_id, "requeued": True, "was": "ended", "ended_on": job.nodes,
                "state": row.state, "now": [row.state, row.reason]}

    def _lift(self, job_id: str, requeued: float) -> None:
        """StartTime=now for a job the requeue held. The requeue revoked the job's credentials
        at a time in whole seconds, and slurmd refuses a credential created in that same second
        ("Killing non-startable batch job: Job credential revoked": the job ends FAILED), so
        not within CREDENTIAL_REVOKE_SECONDS of the requeue."""
        time.sleep(max(0.0, CREDENTIAL_REVOKE_SECONDS - (time.monotonic() - requeued)))
        self._run("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    def _lift_requeue_hold(self, job_id: str, requeued: float) -> JobRow:
        """Watch a requeued job until it starts, lifting the requeue's hold (a begin time
        ahead, the credential's lifetime: about 121 s by default) each time it is seen, until
        the command deadline. The hold is read from the job's begin time, not only its reason:
        squeue shows the reason BeginTime only when a scheduling pass looks at the job, tens of
        seconds later; a lift before the hold is set is overwritten, so the watch does not stop
        at the first reading without it. The last reading: running, or pending for another
        reason (Resources, Priority) at the deadline, or still held (the caller's error)."""
        deadline = requeued + self.settings.command_timeout_seconds
        while True:
            row = self._any_state(job_id)
            if row.state in ("running", "configuring") or time.monotonic() > deadline:
                return row
            if row.held(time.time()):
                self._lift(job_id, requeued)
            elif row.state not in QUEUED:
                return row
            time.sleep(0.2)

    def _settled_state(self, job_id: str, deadline: float) -> JobRow:
        """The job once it is no longer COMPLETING (its ranks are still being cleaned up), or
        COMPLETING at the deadline."""
        while True:
            row = self._any_state(job_id)
            if row.state != "completing" or time.monotonic() > deadline:
                return row
            time.sleep(0.1)

    def _any_state(self, job_id: str) -> JobRow:
        """A job in any state, ended ones included while slurmctld keeps their record;
        ("", "", None) once it is gone."""
        return self._job_row(job_id, "--states=all")

    def resume(self, node: str) -> dict[str, Any]:
        """Return a node Trainwatch drained to service, read back (never one drained or down
        for another reason: that is a person's or Slurm's decision, NodeNotOurs)."""
        current = self.node_state(node)
        if current.drained_by_trainwatch:
            self._run("scontrol", "update", f"NodeName={node}", "State=RESUME")
            after = self._read_back(lambda: self.node_state(node),
                                    lambda s: "drain" not in s.state)
            if "drain" in after.state:
                raise SchedulerError(f"slurm: node {node!r} is still {after.state} after the "
                                     "resume")
            return {"node": node, "resumed": True, "was": current.state, "now": after.state}
        if current.someone_elses:
            raise NodeNotOurs(f"slurm: node {node!r} is {current.state} by someone else "
                              f"({current.reason!r}); Trainwatch leaves it to them")
        return {"node": node, "resumed": "already", "state": current.state}
