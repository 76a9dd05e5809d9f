"""The node exporter's memory: per-job, per-rank state and the job's commands.

Everything the HTTP threads and the datagram receiver share lives here behind one lock; the
critical sections are dictionary updates, so one lock is simpler than finer ones and fast
enough for a node's worth of ranks. Jobs that stop reporting expire, and with them their
series and commands (the collector only yields what is here).
"""

from __future__ import annotations

import copy
import logging
import math
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract import commands as cmd
from trainwatch.exporters.contract.wire import RankReport
from trainwatch.exporters.node.training.command_log import CommandLog
from trainwatch.exporters.node.training.ledger import Ledger
from trainwatch.exporters.node.training.senders import Identity

STEP_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                         60.0, 120.0)
# A rank's own compute time per step is its mean over this many seconds of datagrams
# (TrainingStragglerRank reads it; a minute of steps is enough to rank ranks, short enough to
# name a straggler within minutes).
COMPUTE_WINDOW_SECONDS = 60.0
MAX_COMMANDS_PER_JOB = 1000
MAX_JOBS = 1000
MAX_RETIRED = 16
DEPARTED_AFTER_SECONDS = catalog.RANK_DEPARTED_AFTER_SECONDS  # what it means: catalog.py
# A rank's last word (Store.rank_word): a clean finish, an end on an error of its own, or none
FINISHED, EXITED, SILENT = "finished", "exited", "silent"


@dataclass
class StepHistogram:
    """Step wall times in STEP_DURATION_BUCKETS, counted cumulatively (a duration lands in
    every bucket whose bound it does not exceed), as the exposition wants them."""

    bucket_counts: list[int] = field(default_factory=lambda: [0] * len(STEP_DURATION_BUCKETS))
    duration_sum: float = 0.0
    duration_count: int = 0

    def observe(self, duration: float) -> None:
        self.duration_sum += duration
        self.duration_count += 1
        for i, bound in enumerate(STEP_DURATION_BUCKETS):
            if duration <= bound:
                self.bucket_counts[i] += 1


@dataclass
class RankState:
    """Latest values and cumulative counters of one rank."""

    local_rank: int = 0
    world_size: int = 1
    restarts: int = 0
    # The rank's newest numbers of catalog.RANK_WIRE (what its datagram carries), by metric
    # name; the non-finite loss count is at least nonfinite_seen.
    counters: dict[str, float] = field(default_factory=dict)
    # non-finite losses among the steps this exporter received: a client that does not count
    # them (another implementation of the wire format) still gets the counter
    nonfinite_seen: int = 0
    applied_counts: dict[str, int] = field(default_factory=dict)
    command_types: dict[str, dict[str, Any]] = field(default_factory=dict)
    cuda: tuple[float, float] | None = None
    step: int | None = None
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    data_wait: float | None = None
    last_step_time: float | None = None
    durations: StepHistogram = field(default_factory=StepHistogram)
    last_duration: float | None = None  # the newest step's wall time (stall evidence's pace)
    last_seen: float = 0.0
    heartbeat: float = 0.0  # wall time of the rank's last datagram (any datagram is one)
    finished: bool = False
    collective_seq: int | None = None
    collective_since: float | None = None
    collective_key: int = 0  # the collective it is inside, on any group (0: none)
    exited: bool = False  # its last datagram said it ends without a clean finish
    # (monotonic time, cumulative own compute seconds, measured steps) at datagrams that
    # measured more steps, over COMPUTE_WINDOW_SECONDS plus the sample before it
    compute: deque[tuple[float, float, int]] = field(default_factory=deque)

    def compute_mean(self) -> float | None:
        """Mean own compute time per step over the window; None before two measurements."""
        if len(self.compute) < 2:
            return None
        (_, first_s, first_n), (_, last_s, last_n) = self.compute[0], self.compute[-1]
        return (last_s - first_s) / (last_n - first_n) if last_n > first_n else None


@dataclass
class CommandRecord:
    command: cmd.Command
    created: float
    origin: str  # "api" (posted here) or "peer" (learned from a rank's applied report)
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Why the command will never be applied, once it cannot be: the launch it was meant for
    # ended cleanly before every rank applied it. A closed command is offered to no rank, so
    # a later launch of the same job name never inherits it (it is durable: command_log).
    closed: str | None = None


@dataclass
class NodeRollup:
    """The job's ranks on this node added up, as counters that only grow: what the rules read
    (one series per job and node instead of one per rank, docs/training.md "Series the rules
    read"). Each rank's cumulative counters are added as increases, so a rank that restarts
    from 0, or a new launch that replaces the rank set, never makes the sum go backwards."""

    samples: float = 0.0
    tokens: float = 0.0
    model_flops: float = 0.0
    durations: StepHistogram = field(default_factory=StepHistogram)

    def add_counters(self, before: dict[str, float], now: dict[str, float]) -> None:
        """Add a rank's newest cumulative counters (RankState.counters before and now); a
        value below the previous one is a restarted rank counting again from 0, whose whole
        value is new. FLOPs count only while the rank knows its peak: they are the job's MFU
        numerator, over the peaks of the same ranks (a rank without a peak, on a CPU, counts
        in neither side)."""
        def increase(name: str) -> float:
            return _increase(before.get(name, 0.0), now.get(name, 0.0))

        self.samples += increase(catalog.TRAINING_SAMPLES)
        self.tokens += increase(catalog.TRAINING_TOKENS)
        if now.get(catalog.TRAINING_PEAK_FLOPS, 0.0) > 0:
            self.model_flops += increase(catalog.TRAINING_MODEL_FLOPS)


def _increase(before: float, now: float) -> float:
    return now - before if now >= before else now


@dataclass
class JobState:
    ranks: dict[int, RankState] = field(default_factory=dict)
    rollup: NodeRollup = field(default_factory=NodeRollup)
    commands: OrderedDict[str, CommandRecord] = field(default_factory=OrderedDict)
    last_seen: float = 0.0
    # The launch whose ranks `ranks` holds; earlier launches' ids, whose late datagrams are
    # ignored (a restart's or a smaller world's ranks must not be joined by departed ones).
    incarnation: str = ""
    retired: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_RETIRED))
    # Who may report for, and read the commands of, this job name: the kernel identity of its
    # first sender (senders.py), held until the job expires. None: nobody reported yet (a
    # job read back from the command log).
    owner: Identity | None = None


# The channels a refused caller used, the values of the refusal counter's `channel` label.
REFUSAL_CHANNELS = ("report", "commands", "control_api")


class NotOwner(Exception):
    """A sender spoke for a job name bound to another identity; nothing was changed."""

    def __init__(self, job: str, owner: Identity) -> None:
        super().__init__(f"job {job!r} belongs to {owner}")
        self.job = job
        self.owner = owner


class ApiError(Exception):
    """An HTTP error the control API returns as JSON."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Store:
    """Thread-safe state of every job that reports to this node."""

    _log: CommandLog | None = None  # durable command log (attach_log); memory only without

    def attach_log(self, log: CommandLog) -> None:
        """Make commands durable: read back what an earlier run of the exporter accepted
        (their jobs live for the expiry period, long enough for the ranks to report again and
        poll them), and write every accepted command and outcome from now on."""
        now = self._clock()
        with self._lock:
            for name, records in log.load().items():
                job = self._jobs.setdefault(name, JobState())
                job.last_seen = max(job.last_seen, now)
                for command, origin, _created, ranks, closed in records:
                    if command.id not in job.commands:
                        self._add_command(job, CommandRecord(command, now, origin,
                                                             dict(ranks), closed))
            self._log = log

    def __init__(self, job_expiry_seconds: float, clock: Any = time.monotonic,
                 wall: Any = time.time, departed_after: float = DEPARTED_AFTER_SECONDS,
                 goodput: Ledger | None = None) -> None:
        self._wall = wall
        self._departed_after = departed_after
        self._lock = threading.Lock()
        self._jobs: dict[str, JobState] = {}
        self._expiry = job_expiry_seconds
        self._clock = clock
        self.datagrams = 0
        self.malformed = 0
        self.refused = dict.fromkeys(REFUSAL_CHANNELS, 0)
        # Goodput counters per job (exporters/node/training/ledger.py): the server passes one
        # kept in a LedgerFile (--goodput-state); memory only without it.
        self.goodput = goodput if goodput is not None else Ledger(wall=wall)

    # --- ingest (receiver thread) ---------------------------------------------------------
    def ingest(self, report: RankReport, sender: Identity | None = None) -> None:
        """Take one rank's report. With the sender's kernel identity, a report for a job name
        bound to another identity changes nothing: it is counted and NotOwner raised."""
        now = self._clock()
        with self._lock:
            self.datagrams += 1
            job = self._jobs.get(report.job)
            if job is None:
                if len(self._jobs) >= MAX_JOBS:
                    return
                job = self._jobs[report.job] = JobState()
            if sender is not None and not self._admit(job, report, sender):
                self.refused["report"] += 1
                raise NotOwner(report.job, job.owner)  # type: ignore[arg-type]  # bound
            if not self._member(job, report):
                return
            job.last_seen = now
            state = job.ranks.setdefault(report.rank, RankState())
            state.last_seen = now
            state.heartbeat = self._wall()
            state.finished = report.finished
            state.collective_seq = report.collective_seq
            state.collective_since = report.collective_since
            state.collective_key = report.collective_key
            state.exited = report.exiting
            self._add_compute(state, now, report)
            state.local_rank = report.local_rank
            state.world_size = report.world_size
            state.restarts = report.restarts
            # Cumulative counters never go backwards within one process; a restarted rank
            # starts again from 0, which Prometheus treats as a counter reset.
            rollup = job.rollup
            rollup.add_counters(state.counters, report.counters)
            state.counters = dict(report.counters)
            state.applied_counts = dict(report.applied_counts)
            state.command_types = dict(report.command_types)
            if report.cuda is not None:
                state.cuda = report.cuda
            for step, wall, duration, loss, lr, grad_norm, data_wait in report.steps:
                state.step = step
                state.last_step_time = wall if wall is not None else state.last_step_time
                state.loss = loss
                if loss is not None and not math.isfinite(loss):
                    state.nonfinite_seen += 1
                state.lr = lr if lr is not None else state.lr
                state.grad_norm = grad_norm if grad_norm is not None else state.grad_norm
                state.data_wait = data_wait if data_wait is not None else state.data_wait
                if duration is not None and math.isfinite(duration) and duration >= 0:
                    state.durations.observe(duration)
                    state.last_duration = duration
                    rollup.durations.observe(duration)
            state.counters[catalog.TRAINING_NONFINITE_LOSS] = max(
                state.counters.get(catalog.TRAINING_NONFINITE_LOSS, 0), state.nonfinite_seen)
            for event in report.applied:
                self._record_applied(job, report.rank, event, now, report.job)
            if report.goodput is not None:
                self.goodput.ingest(report.job, report.incarnation, report.rank,
                                    report.finished, report.goodput, state.heartbeat)
            if report.finished and all(s.finished for s in job.ranks.values()):
                self._close_pending(job, report.job)

    def _close_pending(self, job: JobState, job_name: str) -> None:
        """Every rank of the launch here reported a clean end: a command some of them have
        not applied never will be, and must not wait for the next launch of the name (a new
        run, which would apply an old run's LR cut or rollback at its first agreement)."""
        reason = (f"job {job_name!r} finished (every rank reported a clean end) before "
                  "every rank applied it")
        for record in job.commands.values():
            if record.closed is None and any(
                    record.ranks.get(r, {}).get("status") is None for r in job.ranks):
                record.closed = reason
                command_id = record.command.id
                self._durably(lambda log, i=command_id: log.close_command(job_name, i, reason))

    @staticmethod
    def _add_compute(state: RankState, now: float, report: RankReport) -> None:
        samples = state.compute
        if samples and report.compute_steps < samples[-1][2]:
            samples.clear()  # a restarted process counts from 0 again
        if samples and report.compute_steps == samples[-1][2]:
            return
        samples.append((now, report.compute_seconds, report.compute_steps))
        while len(samples) > 2 and samples[1][0] <= now - COMPUTE_WINDOW_SECONDS:
            samples.popleft()

    @staticmethod
    def _admit(job: JobState, report: RankReport, sender: Identity) -> bool:
        """Whether this sender may report for the job: its first sender binds the name; the
        same user may move it to another job of theirs (a resubmission under a new Slurm job
        id, a new torchrun run id) only with a launch the job has not seen yet. Another user
        never: the name stays theirs until the job expires."""
        if job.owner is None or job.owner == sender:
            job.owner = sender
            return True
        if (job.owner.uid == sender.uid and report.incarnation
                and report.incarnation != job.incarnation
                and report.incarnation not in job.retired):
            job.owner = sender
            return True
        return False

    def count_refused(self, channel: str) -> None:
        """Count a refused call on one of REFUSAL_CHANNELS (served by the collector)."""
        with self._lock:
            self.refused[channel] += 1

    def owner(self, job_name: str) -> Identity | None:
        """The identity the job name is bound to (None: unknown or not bound yet)."""
        with self._lock:
            job = self._jobs.get(job_name)
            return job.owner if job is not None else None

    @staticmethod
    def _member(job: JobState, report: RankReport) -> bool:
        """Whether the report belongs to the job's current launch; a new launch (restart,
        other world size) replaces the rank set at its first datagram."""
        if not report.incarnation or report.incarnation == job.incarnation:
            return True
        if report.incarnation in job.retired:
            return False  # a departed rank's last datagrams
        if job.incarnation:
            job.retired.append(job.incarnation)
        job.incarnation = report.incarnation
        job.ranks = {}
        return True

    def _record_applied(self, job: JobState, rank: int, event: dict[str, Any],
                        now: float, job_name: str = "") -> None:
        record = job.commands.get(event["id"])
        if record is None:
            # Learned by a rank through the in-band agreement, posted to another node.
            record = CommandRecord(cmd.Command(event["id"], event["type"],
                                               dict(event.get("args", {}))), now, "peer")
            self._add_command(job, record)
            self._durably(lambda log: log.add(job_name, record.command, "peer", time.time()))
        status = {"status": event["status"], "step": event["step"]}
        if event.get("error"):
            status["error"] = str(event["error"])[:500]
        if record.ranks.get(rank) != status:  # applied reports repeat for a while: write once
            self._durably(lambda log: log.outcome(job_name, record.command.id, rank, status))
        record.ranks[rank] = status

    def _durably(self, write: Any) -> None:
        """Write to the command log from the receiver thread; a failure is logged, not fatal
        (the rank re-reports its outcome, and the rank's own state is exactly-once anyway)."""
        if self._log is None:
            return
        try:
            write(self._log)
        except sqlite3.Error as exc:
            logging.getLogger(__name__).warning("command log write failed: %s", exc)

    @staticmethod
    def _add_command(job: JobState, record: CommandRecord) -> None:
        job.commands[record.command.id] = record
        while len(job.commands) > MAX_COMMANDS_PER_JOB:
            job.commands.popitem(last=False)

    def rank_word(self, job_name: str, incarnation: str, rank: int) -> str | None:
        """What the rank's last datagram said of its end (FINISHED, EXITED, SILENT: nothing,
        it still reports or was killed); None when the rank is not of the job's current
        launch here (another launch replaced it, or the job expired)."""
        with self._lock:
            job = self._jobs.get(job_name)
            if job is None or (incarnation and incarnation != job.incarnation):
                return None
            state = job.ranks.get(rank)
            if state is None:
                return None
            return FINISHED if state.finished else EXITED if state.exited else SILENT

    # --- expiry ---------------------------------------------------------------------------
    def expire(self) -> None:
        cutoff = self._clock() - self._expiry
        with self._lock:
            for name in [n for n, j in self._jobs.items() if j.last_seen < cutoff]:
                del self._jobs[name]

    # --- control API (HTTP threads) -------------------------------------------------------
    def _job(self, name: str) -> JobState:
        job = self._jobs.get(name)
        if job is None or job.last_seen < self._clock() - self._expiry:
            raise ApiError(404, f"unknown job {name!r}: no rank of it reports to this node")
        return job

    @staticmethod
    def _schemas(job: JobState) -> dict[str, dict[str, Any]]:
        schemas = dict(cmd.BUILTIN_SCHEMAS)
        for state in job.ranks.values():
            for name, schema in state.command_types.items():
                schemas.setdefault(name, schema)
        return schemas

    def post_command(self, job_name: str, payload: Any) -> tuple[int, dict[str, Any]]:
        """Validate and store a command; the same id again returns the stored one (200)."""
        with self._lock:
            job = self._job(job_name)
            try:
                command = cmd.validate(payload, self._schemas(job))
            except cmd.CommandError as exc:
                raise ApiError(400, str(exc)) from None
            if command.id:
                existing = job.commands.get(command.id)
                if existing is not None:
                    if (existing.command.type, existing.command.args) != (command.type,
                                                                          command.args):
                        raise ApiError(409, f"command id {command.id!r} exists with a "
                                            "different type or args")
                    return 200, self._describe(job, existing)
            if job.ranks and all(s.finished for s in job.ranks.values()):
                raise ApiError(409, f"job {job_name!r} finished: every rank of it here "
                                    "reported a clean end, so no rank would apply the command "
                                    "(and a later launch of the name must not inherit it)")
            if not command.id:
                command = cmd.Command(uuid.uuid4().hex, command.type, command.args)
            record = CommandRecord(command, self._clock(), "api")
            if self._log is not None:  # durable before the 202, or not accepted at all
                try:
                    self._log.add(job_name, command, "api", time.time())
                except sqlite3.Error as exc:
                    raise ApiError(503, f"command log unavailable: {exc}") from None
            self._add_command(job, record)
            return 202, self._describe(job, record)

    def _describe(self, job: JobState, record: CommandRecord) -> dict[str, Any]:
        """The command with every member's status and one overall status.

        Judged against the current launch's members that are still there: ranks of a
        previous launch (restart, larger world) no longer count, and neither does a rank
        whose datagrams stopped `departed_after` seconds ago (killed, its node left, the job
        scaled down without it): it is listed as "departed" and nothing waits for it. An
        exporter whose ranks all departed answers "departed" (a ghost of a scale-down:
        remediation stops waiting on it). Before any rank of the job reported to this
        exporter process (it restarted and read the command log), the ranks that reported
        the command are the best members known."""
        cutoff = self._clock() - self._departed_after
        departed = {r for r, s in job.ranks.items() if not s.finished and s.last_seen < cutoff}
        members = (set(job.ranks) - departed) if job.ranks else set(record.ranks)
        ranks = {str(r): {"status": "departed"} for r in sorted(departed)}
        ranks.update({str(r): {"status": "pending"} for r in sorted(members)})
        ranks.update({str(r): dict(s) for r, s in sorted(record.ranks.items())
                      if r in members})
        statuses = {ranks[str(r)]["status"] for r in members}
        overall = ("applied" if statuses == {"applied"} else
                   "failed" if "failed" in statuses else
                   "cancelled" if record.closed is not None else
                   "departed" if not members else
                   "partial" if "applied" in statuses else "pending")
        described = {**record.command.to_wire(), "status": overall, "origin": record.origin,
                     "ranks": ranks}
        if overall == "cancelled":
            described["reason"] = record.closed
        return described

    def get_command(self, job_name: str, command_id: str) -> dict[str, Any]:
        with self._lock:
            job = self._job(job_name)
            record = job.commands.get(command_id)
            if record is None:
                raise ApiError(404, f"unknown command {command_id!r} for job {job_name!r}")
            return self._describe(job, record)

    def list_commands(self, job_name: str, pending_for_rank: int | None) -> list[dict[str, Any]]:
        """All commands of a job, or those a given rank has not yet reported as done (a
        closed one is offered to no rank)."""
        with self._lock:
            job = self._job(job_name)
            return [self._describe(job, r) for r in job.commands.values()
                    if pending_for_rank is None
                    or (pending_for_rank not in r.ranks and r.closed is None)]

    def pending_for(self, job_name: str, rank: int, sender: Identity) -> list[dict[str, Any]]:
        """The commands a rank of the job has not applied, for a process of that job only
        (the command socket's one question). Nothing yet before the job's first report binds
        it; another identity's question is counted and NotOwner raised."""
        with self._lock:
            job = self._jobs.get(job_name)
            if job is None or job.owner is None or job.last_seen < self._clock() - self._expiry:
                return []
            if job.owner != sender:
                self.refused["commands"] += 1
                raise NotOwner(job_name, job.owner)
            return [self._describe(job, r) for r in job.commands.values()
                    if rank not in r.ranks and r.closed is None]

    def list_jobs(self) -> list[dict[str, Any]]:
        cutoff = self._clock() - self._expiry
        with self._lock:
            return [{
                "job": name,
                "incarnation": job.incarnation,
                "world_size": max((s.world_size for s in job.ranks.values()), default=0),
                "ranks": {str(r): {"step": s.step, "local_rank": s.local_rank,
                                   "restarts": s.restarts,
                                   "command_types": sorted(cmd.BUILTIN_SCHEMAS)
                                   + sorted(s.command_types)}
                          for r, s in sorted(job.ranks.items())},
                "last_step": max((s.step for s in job.ranks.values() if s.step is not None),
                                 default=None),
            } for name, job in sorted(self._jobs.items()) if job.last_seen >= cutoff]

    def wall(self) -> float:
        """Now, on the clock heartbeats and step times are written in."""
        return float(self._wall())

    # --- collector --------------------------------------------------------------------------
    def snapshot(self) -> dict[str, dict[int, RankState]]:
        """A private copy for one scrape, so rendering happens outside the lock."""
        return {name: ranks for name, (ranks, _, _) in self.snapshot_with_launches().items()}

    def snapshot_with_launches(self) -> dict[str, tuple[dict[int, RankState], NodeRollup, str]]:
        """Each live job's ranks, their node rollup and the launch (incarnation) the ranks
        belong to, copied for one scrape."""
        cutoff = self._clock() - self._expiry
        with self._lock:
            return {name: (copy.deepcopy(job.ranks), copy.deepcopy(job.rollup), job.incarnation)
                    for name, job in self._jobs.items() if job.last_seen >= cutoff}
