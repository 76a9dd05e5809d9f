"""Goodput: every second of a job's life, by what it was spent on (docs/goodput.md).

Two halves, one model:

* On the rank (`RankAccount`, run by the shipper thread, never the training thread): the
  rank's own timeline from process start, cut at every step report. Each interval between two
  reports is split into data wait (what the loop reported), checkpoint save and restore (time
  the training thread spent inside the CheckpointManager, recorded by `blocking`), and the
  rest: startup in the first interval, stall for the part of an interval beyond
  `STALL_STEP_FACTOR` x the rank's median step (and at least `STALL_FLOOR_SECONDS`), productive
  otherwise. A rollback discards the productive seconds of the steps it threw away: the
  rank's kept progress ("goodput") at the restored checkpoint is remembered at every save
  (`marks`). Everything is cumulative and rides in every datagram, so a lost datagram or an
  exporter that was down loses nothing.
* On the node exporter (`Ledger`): the job's ranks on this node added up as counters that
  never go backwards, in rank-seconds (like CPU seconds over cores): increases of every
  rank's cumulative values, plus what no rank can see itself: the trailing seconds of an
  incarnation that ended without a clean finish (its last step to its last heartbeat: stall),
  the downtime between incarnations (last heartbeat of the old to each new process's start),
  and the progress a restart lost (the old ranks' kept progress beyond the checkpoint the new
  incarnation resumed from). Kept on disk (`--goodput-state`, SQLite) and written before every
  scrape, so an exporter restart neither resets nor double counts them.

Every second lands in exactly one kind (`KINDS`); wall is their sum, so the parts add up by
construction. Discarded seconds are a part of productive ones (productive - discarded =
goodput), so no counter ever has to decrease.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)

# The partition of wall time (label `kind` of training_node_time_seconds_total).
PRODUCTIVE = "productive"
CAUSES = ("startup", "data_wait", "checkpoint_save", "checkpoint_restore", "stall", "downtime",
          "unattributed")
KINDS = (PRODUCTIVE, *CAUSES)
# What a rank counts itself (downtime is only seen by the exporter).
RANK_KINDS = tuple(k for k in KINDS if k != "downtime")
# The causes also served per rank (they point at one rank: its loader, its storage).
PER_RANK_CAUSES = ("data_wait", "checkpoint_save")
# Why productive seconds were thrown away (label `cause` of training_node_discarded_...).
DISCARD_CAUSES = ("rollback", "restart")
# A step interval is a stall when its time outside data wait and checkpoints exceeds
# max(STALL_STEP_FACTOR x the median of the rank's last STALL_WINDOW steps, STALL_FLOOR_SECONDS);
# the part beyond the median step is stall, the median itself productive.
STALL_STEP_FACTOR = 10.0
STALL_FLOOR_SECONDS = 5.0
STALL_WINDOW = 64
STALL_MIN_STEPS = 5
MAX_MARKS = 16  # checkpoint marks a datagram carries (a restart resumes from one of them)
# Checkpoint event kinds recorded by `blocking` (CheckpointManager methods).
SAVE, RESTORE = "save", "restore"
# How long the exporter keeps a job's ledger after its last datagram: a job that comes back
# (requeued, preempted) continues its counters instead of starting again.
LEDGER_RETENTION_SECONDS = 7 * 86400
MAX_LEDGER_JOBS = 1000
F = TypeVar("F", bound=Callable[..., Any])


# --- rank side: checkpoint time ----------------------------------------------------------
def blocking(kind: str, when: Callable[[Any], bool] | None = None) -> Callable[[F], F]:
    """Decorate a CheckpointManager method: the time the calling thread spends in it is
    checkpoint save (`SAVE`) or restore (`RESTORE`) time, recorded on the manager as
    `goodput_events` (seq, kind, start, end, step) in perf_counter seconds. Nested calls (a
    save waiting for the previous one, a resume that rolls back) count once, as the outer
    kind. The step is a save's first argument, or the step a restore returned (-1: none; None
    when it raised, so a failed rollback discards nothing). `when(self)` false: the call is
    not timed at all (the optimizer's per-step wait for a staging copy that is not running
    costs one predicate, not two clock reads and an event)."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            local = self.__dict__
            if local.get("_goodput_depth", 0) or (when is not None and not when(self)):
                return method(self, *args, **kwargs)
            local["_goodput_depth"] = 1
            events = local.get("goodput_events")
            if events is None:
                events = local["goodput_events"] = deque(maxlen=256)
            start = time.perf_counter()
            result: Any = None
            failed = True
            try:
                result = method(self, *args, **kwargs)
                failed = False
                return result
            finally:
                local["_goodput_depth"] = 0
                end = time.perf_counter()
                step: int | None = None
                if kind == SAVE:
                    first = args[0] if args else kwargs.get("step")
                    step = first if isinstance(first, int) else None
                elif kind == RESTORE and not failed:
                    restored = getattr(result, "step", None)
                    step = restored if isinstance(restored, int) else -1
                seq = local.get("_goodput_seq", 0) + 1
                local["_goodput_seq"] = seq
                events.append((seq, kind, start, end, step))
        return timed  # type: ignore[return-value]
    return wrap


def process_start_wall() -> float | None:
    """Unix time this process started (Linux /proc, 10 ms resolution); None elsewhere."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class RankAccount:
    """One rank's timeline, cut at its step reports. Used by one thread (the shipper)."""

    def __init__(self, start_perf: float, start_wall: float, checkpoints: Any = None) -> None:
        self.start_wall = start_wall
        self._start_perf = start_perf
        self._closed = start_perf  # perf_counter time up to which every second is counted
        self._checkpoints = checkpoints
        self._event_seq = 0  # newest checkpoint event consumed
        self.seconds = dict.fromkeys(RANK_KINDS, 0.0)
        self.discarded = 0.0  # by rollbacks, within this process
        self.goodput = 0.0  # productive - discarded: this process's kept progress
        self.marks: deque[tuple[int, float]] = deque(maxlen=MAX_MARKS)
        self.resumed: int | None = None  # checkpoint step resumed from at start; -1: none
        self._first = True
        self._recent: deque[float] = deque(maxlen=STALL_WINDOW)

    def _events(self, until: float) -> tuple[float, float]:
        """Consume the checkpoint events that started before `until`; (save, restore)
        seconds of them inside the open interval, with marks and rollbacks applied."""
        save = restore = 0.0
        events = getattr(self._checkpoints, "goodput_events", None)
        if not events or events[-1][0] <= self._event_seq:  # nothing new: the common case
            return save, restore
        for seq, kind, start, end, step in list(events):
            if seq <= self._event_seq or start >= until:
                continue
            self._event_seq = seq
            seconds = max(0.0, min(end, until) - max(start, self._closed))
            if kind == SAVE:
                save += seconds
                if step is not None:
                    self.marks.append((step, self.goodput))
            else:
                restore += seconds
                if step is not None:  # None: the restore failed and changed nothing
                    self._restored(step)
        return save, restore

    def _restored(self, step: int) -> None:
        if self._first and self.goodput == 0.0:
            self.resumed = step  # the start of this process: what the exporter needs
            return
        kept = mark_at(list(self.marks), step)
        self.discarded += max(0.0, self.goodput - kept)
        self.goodput = min(self.goodput, kept)
        while self.marks and self.marks[-1][0] > step:
            self.marks.pop()

    def step(self, at: float, data_wait: float | None) -> None:
        """A step report at perf_counter time `at` closes the interval since the last one."""
        interval = at - self._closed
        if interval < 0:
            return
        save, restore = self._events(at)
        blocked = min(interval, save + restore)
        reported = data_wait if data_wait is not None and math.isfinite(data_wait) else 0.0
        wait = min(max(reported, 0.0), interval - blocked)
        rest = interval - blocked - wait
        s = self.seconds
        s["checkpoint_save"] += min(save, blocked)
        s["checkpoint_restore"] += blocked - min(save, blocked)
        s["data_wait"] += wait
        if self._first:
            s["startup"] += rest
            self._first = False
            if self.resumed is None and self._checkpoints is not None:
                self.resumed = -1  # a checkpoint manager that restored nothing: from scratch
        else:
            stall = 0.0
            if rest > STALL_FLOOR_SECONDS and len(self._recent) >= STALL_MIN_STEPS:
                median = _median(self._recent)
                if rest > max(STALL_STEP_FACTOR * median, STALL_FLOOR_SECONDS):
                    stall = rest - median
            if stall:
                s["stall"] += stall
                rest -= stall
            else:
                self._recent.append(rest)
            s[PRODUCTIVE] += rest
            self.goodput += rest
        self._closed = at

    def finish(self, at: float) -> None:
        """A clean end (the monitor closed): the trailing seconds since the last report are
        checkpoint time where the manager was busy, unattributed otherwise."""
        interval = at - self._closed
        if interval <= 0:
            return
        save, restore = self._events(at)
        blocked = min(interval, save + restore)
        self.seconds["checkpoint_save"] += min(save, blocked)
        self.seconds["checkpoint_restore"] += blocked - min(save, blocked)
        self.seconds["unattributed"] += interval - blocked
        self._closed = at

    def wire(self) -> dict[str, Any]:
        """The cumulative values a datagram carries (see `parse`)."""
        return {"start": self.start_wall, "seconds": [self.seconds[k] for k in RANK_KINDS],
                "discarded": self.discarded, "goodput": self.goodput,
                "marks": [list(m) for m in self.marks], "resumed": self.resumed}


def mark_at(marks: list[tuple[int, float]] | list[list[Any]], step: int) -> float:
    """Kept progress at the newest mark not after `step` (0 when there is none: the process
    started after it, so all of its progress is beyond it)."""
    best: tuple[int, float] | None = None
    for mark_step, value in marks:
        if mark_step <= step and (best is None or mark_step >= best[0]):
            best = (int(mark_step), float(value))
    return best[1] if best else 0.0


# --- wire -------------------------------------------------------------------------------------
@dataclass
class RankGoodput:
    """A rank's cumulative goodput values, as one datagram carried them (validated)."""

    start: float
    seconds: dict[str, float]
    discarded: float
    goodput: float
    marks: list[tuple[int, float]]
    resumed: int | None

    @property
    def closed_end(self) -> float:
        """Unix time up to which the rank counted its seconds (its last report)."""
        return self.start + sum(self.seconds.values())


def _nonneg(value: Any) -> float:
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or value < 0):
        raise ValueError("goodput values must be finite numbers >= 0")
    return float(value)


def parse(obj: Any) -> RankGoodput | None:
    """Validate a datagram's "goodput" member; raise ValueError for anything off-contract."""
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ValueError("goodput must be an object")
    seconds = obj.get("seconds")
    if not isinstance(seconds, list) or len(seconds) != len(RANK_KINDS):
        raise ValueError(f"goodput seconds must list {len(RANK_KINDS)} numbers")
    marks = obj.get("marks", [])
    if not isinstance(marks, list) or len(marks) > MAX_MARKS:
        raise ValueError("goodput marks must be a short list")
    parsed_marks = []
    for mark in marks:
        if (not isinstance(mark, list) or len(mark) != 2 or not isinstance(mark[0], int)
                or isinstance(mark[0], bool) or mark[0] < 0):
            raise ValueError("goodput mark must be [step, seconds]")
        parsed_marks.append((mark[0], _nonneg(mark[1])))
    resumed = obj.get("resumed")
    if resumed is not None and (not isinstance(resumed, int) or isinstance(resumed, bool)
                                or resumed < -1):
        raise ValueError("goodput resumed must be a step, -1 or null")
    start = _nonneg(obj.get("start"))
    if start <= 0:
        raise ValueError("goodput start must be a Unix time")
    return RankGoodput(start=start,
                       seconds={k: _nonneg(v) for k, v in zip(RANK_KINDS, seconds, strict=True)},
                       discarded=_nonneg(obj.get("discarded", 0)),
                       goodput=_nonneg(obj.get("goodput", 0)), marks=parsed_marks,
                       resumed=resumed)


# --- exporter side: the node's ledger ---------------------------------------------------------
@dataclass
class RankEntry:
    """What the ledger last saw of one rank of the current incarnation."""

    start: float
    seen: dict[str, float]  # cumulative values already added (kinds and "discarded")
    closed_end: float
    heartbeat: float
    finished: bool = False
    goodput: float = 0.0
    marks: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class JobLedger:
    """One job's counters on this node and what is needed to continue them."""

    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("wall", *KINDS, *(f"discarded_{c}" for c in DISCARD_CAUSES)), 0.0))
    incarnation: str = ""
    ranks: dict[int, RankEntry] = field(default_factory=dict)
    retired: list[str] = field(default_factory=list)
    # The incarnation before this one: when it ended, its ranks' kept progress and marks
    # (for the restart's discard, once a new rank says where it resumed), and which new
    # ranks were charged the downtime.
    previous_end: float | None = None
    previous_ranks: dict[int, tuple[float, list[tuple[int, float]]]] = field(default_factory=dict)
    restart_settled: bool = True
    updated: float = 0.0

    def add(self, kind: str, seconds: float) -> None:
        if seconds > 0:
            self.totals[kind] += seconds
            if kind in KINDS:
                self.totals["wall"] += seconds

    def to_json(self) -> dict[str, Any]:
        return {"totals": self.totals, "incarnation": self.incarnation,
                "ranks": {str(r): {"start": e.start, "seen": e.seen, "closed_end": e.closed_end,
                                   "heartbeat": e.heartbeat, "finished": e.finished,
                                   "goodput": e.goodput, "marks": e.marks}
                          for r, e in self.ranks.items()},
                "retired": self.retired, "previous_end": self.previous_end,
                "previous_ranks": {str(r): [g, m] for r, (g, m) in self.previous_ranks.items()},
                "restart_settled": self.restart_settled, "updated": self.updated}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobLedger:
        job = cls()
        job.totals.update({k: float(v) for k, v in data.get("totals", {}).items()
                           if k in job.totals})
        job.incarnation = str(data.get("incarnation", ""))
        job.ranks = {int(r): RankEntry(float(e["start"]), dict(e["seen"]),
                                       float(e["closed_end"]), float(e["heartbeat"]),
                                       bool(e["finished"]), float(e["goodput"]),
                                       [(int(s), float(v)) for s, v in e["marks"]])
                     for r, e in data.get("ranks", {}).items()}
        job.retired = [str(i) for i in data.get("retired", [])]
        job.previous_end = data.get("previous_end")
        job.previous_ranks = {int(r): (float(g), [(int(s), float(v)) for s, v in m])
                              for r, (g, m) in data.get("previous_ranks", {}).items()}
        job.restart_settled = bool(data.get("restart_settled", True))
        job.updated = float(data.get("updated", 0.0))
        return job


class LedgerFile:
    """The ledger's durable copy: one JSON document per job in SQLite (WAL)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.path.chmod(0o600)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # a crashed exporter, not a power cut
        self._db.execute("CREATE TABLE IF NOT EXISTS goodput (job TEXT PRIMARY KEY, "
                         "state TEXT NOT NULL)")

    def load(self) -> dict[str, JobLedger]:
        jobs = {}
        for job, state in self._db.execute("SELECT job, state FROM goodput"):
            try:
                jobs[job] = JobLedger.from_json(json.loads(state))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("goodput state of job %s unreadable, starting it again: %s", job, exc)
        return jobs

    def write(self, jobs: dict[str, str], removed: Iterable[str] = ()) -> None:
        """Upsert the jobs' JSON documents and delete the removed ones, in one transaction."""
        self._db.execute("BEGIN")
        try:
            self._db.executemany("INSERT INTO goodput (job, state) VALUES (?, ?) ON CONFLICT "
                                 "(job) DO UPDATE SET state = excluded.state",
                                 list(jobs.items()))
            self._db.executemany("DELETE FROM goodput WHERE job = ?", [(n,) for n in removed])
        except sqlite3.Error:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()


class Ledger:
    """The node's goodput counters per job. Thread-safe; durable with a LedgerFile."""

    def __init__(self, file: LedgerFile | None = None, wall: Callable[[], float] = time.time
                 ) -> None:
        self._lock = threading.Lock()
        self._file = file
        self._wall = wall
        self._jobs: dict[str, JobLedger] = file.load() if file is not None else {}
        self._dirty: set[str] = set()
        self._removed: set[str] = set()

    def ingest(self, job_name: str, incarnation: str, rank: int, finished: bool,
               g: RankGoodput, heartbeat: float) -> None:
        """Add what one datagram of a rank says (called by the store's receiver thread)."""
        if not incarnation:
            return
        with self._lock:
            job = self._jobs.get(job_name)
            if job is None:
                if len(self._jobs) >= MAX_LEDGER_JOBS:
                    return
                job = self._jobs[job_name] = JobLedger()
            if incarnation in job.retired:
                return  # a departed rank's last datagrams: its seconds were closed already
            if incarnation != job.incarnation:
                self._next_incarnation(job, incarnation)
            entry = job.ranks.get(rank)
            if entry is not None and g.start > entry.start + 0.5:
                # Another process under the same incarnation id (a relaunch whose id is
                # derived from an unchanged environment): close the old one like an
                # incarnation's end, for this rank, and count the new one from 0.
                job.add("unattributed" if entry.finished else "stall",
                        entry.heartbeat - entry.closed_end)
                job.add("downtime", g.start - entry.heartbeat)
                entry = job.ranks[rank] = RankEntry(
                    g.start, {**dict.fromkeys(RANK_KINDS, 0.0), "discarded": 0.0},
                    g.start, heartbeat)
            if entry is None:
                entry = job.ranks[rank] = RankEntry(
                    g.start, {**dict.fromkeys(RANK_KINDS, 0.0), "discarded": 0.0},
                    g.start, heartbeat)
                if job.previous_end is not None:
                    job.add("downtime", g.start - job.previous_end)
            for kind in RANK_KINDS:
                job.add(kind, g.seconds[kind] - entry.seen[kind])
                entry.seen[kind] = max(entry.seen[kind], g.seconds[kind])
            job.add("discarded_rollback", g.discarded - entry.seen["discarded"])
            entry.seen["discarded"] = max(entry.seen["discarded"], g.discarded)
            entry.closed_end = max(entry.closed_end, g.closed_end)
            entry.heartbeat = max(entry.heartbeat, heartbeat)
            entry.finished = finished
            entry.goodput, entry.marks = g.goodput, list(g.marks)
            if not job.restart_settled and g.resumed is not None:
                job.restart_settled = True
                job.add("discarded_restart", sum(
                    max(0.0, kept - mark_at(marks, g.resumed))
                    for kept, marks in job.previous_ranks.values()))
            job.updated = self._wall()
            self._dirty.add(job_name)

    @staticmethod
    def _next_incarnation(job: JobLedger, incarnation: str) -> None:
        """Close the current incarnation's ranks: their seconds after the last report up to
        the incarnation's last heartbeat are stall (unattributed after a clean finish)."""
        if job.incarnation:
            job.retired = [*job.retired, job.incarnation][-16:]
        if job.ranks:
            end = max(e.heartbeat for e in job.ranks.values())
            for entry in job.ranks.values():
                job.add("unattributed" if entry.finished else "stall",
                        end - entry.closed_end)
            job.previous_end = end
            job.previous_ranks = {r: (e.goodput, e.marks) for r, e in job.ranks.items()}
            job.restart_settled = False
        job.incarnation = incarnation
        job.ranks = {}

    def rank_seconds(self, names: Iterable[str]) -> dict[str, dict[int, dict[str, float]]]:
        """Each current rank's own cumulative seconds of PER_RANK_CAUSES, by job (a new
        incarnation's ranks count again from 0, as every per-rank counter does)."""
        with self._lock:
            return {n: {r: {k: e.seen[k] for k in PER_RANK_CAUSES}
                        for r, e in self._jobs[n].ranks.items()}
                    for n in names if n in self._jobs}

    def totals(self, names: Iterable[str]) -> dict[str, dict[str, float]]:
        """The counters of the named jobs, written to disk first: a value once served is never
        lost by a restart, so it never goes backwards."""
        self.flush()
        with self._lock:
            return {n: dict(self._jobs[n].totals) for n in names if n in self._jobs}

    def flush(self) -> None:
        """Write changed jobs to the ledger file (and forget long-gone ones)."""
        with self._lock:
            cutoff = self._wall() - LEDGER_RETENTION_SECONDS
            for name in [n for n, j in self._jobs.items() if j.updated < cutoff]:
                del self._jobs[name]
                self._dirty.discard(name)
                self._removed.add(name)
            if self._file is None or not (self._dirty or self._removed):
                self._dirty.clear()
                return
            changed = {n: json.dumps(self._jobs[n].to_json()) for n in self._dirty}
            removed = list(self._removed)
            try:
                self._file.write(changed, removed)
            except sqlite3.Error as exc:
                log.warning("goodput state write failed: %s", exc)
                return
            self._dirty.clear()
            self._removed.clear()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
