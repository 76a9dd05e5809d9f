"""The node's goodput ledger: a job's ranks on this node added up as counters that never go
backwards, in rank-seconds (like CPU seconds over cores).

It adds the increases of every rank's cumulative values (`trainwatch.exporters.contract.goodput`)
plus what no rank can see itself: the trailing seconds of an incarnation that ended without a
clean finish (its last step to its last heartbeat: stall), the downtime between incarnations
(last heartbeat of the old, or the old rank's own record where that ends later, to each new
process's start), and the progress a restart lost (the
old ranks' kept progress beyond the checkpoint the new incarnation resumed from). Kept on disk
(`--goodput-state`, SQLite): the collector persists the ledger before it serves it, so an
exporter restart neither resets nor double counts.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainwatch.exporters.contract.goodput import (
    DISCARD_CAUSES,
    KINDS,
    PER_RANK_CAUSES,
    PRODUCTIVE,
    RANK_KINDS,
    Handoff,
    RankGoodput,
    mark_at,
)

log = logging.getLogger(__name__)

# How long the exporter keeps a job's ledger after its last datagram: a job that comes back
# (requeued, preempted) continues its counters instead of starting again.
LEDGER_RETENTION_SECONDS = 7 * 86400
MAX_LEDGER_JOBS = 1000


# A new job's counters are served at zero this long before they show what they hold, so that
# every scraper sees them at zero once (rate() never counts a series' first value; at least
# one scrape interval). --goodput-zero-seconds.
ZERO_HOLD_SECONDS = 30.0
# How much later than this node's last heartbeat of an old rank its own record (a new rank's
# handoff) must end for the record's view of its end to be used: beyond the few milliseconds
# that separate a datagram's receipt from the record written after it was sent, so an
# exporter that heard the rank to its end keeps its own (the same) view.
HANDOFF_NEWER_SECONDS = 0.1
# Totals beyond the kinds: discards by cause and the negative intervals found.
NEGATIVE = "negative_intervals"
TOTALS = ("wall", *KINDS, *(f"discarded_{c}" for c in DISCARD_CAUSES), NEGATIVE)


@dataclass
class RankEntry:
    """What the ledger last saw of one rank of the current incarnation. Times are the
    exporter's wall clock (`start`: the process start as the exporter places it)."""

    start: float
    seen: dict[str, float]  # cumulative values already added (kinds and "discarded")
    closed_end: float
    heartbeat: float
    finished: bool = False
    goodput: float = 0.0
    marks: list[tuple[int, float]] = field(default_factory=list)
    age: float = 0.0  # the process's age in its newest datagram
    negative: int = 0  # the rank's own count of negative intervals, already added
    settled: bool = False  # silent long enough: its trailing seconds are booked
    # A new incarnation's rank whose slot's restart discard is not booked yet (it is once the
    # rank says where it resumed), and whether its gap came from its handoff (the slot's rank
    # before it reported elsewhere) rather than this node's own record.
    joining: bool = False
    handed: bool = False

    @classmethod
    def fresh(cls, start: float, heartbeat: float) -> RankEntry:
        return cls(start, {**dict.fromkeys(RANK_KINDS, 0.0), "discarded": 0.0}, start,
                   heartbeat)


@dataclass
class JobLedger:
    """One job's counters on this node and what is needed to continue them."""

    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TOTALS, 0.0))
    incarnation: str = ""
    ranks: dict[int, RankEntry] = field(default_factory=dict)
    retired: list[str] = field(default_factory=list)
    # The incarnation before this one on this node: when it ended here, and its ranks' kept
    # progress and marks, each slot's taken by the slot's next rank here (its restart
    # discard, once that rank says where it resumed).
    previous_end: float | None = None
    previous_ranks: dict[int, tuple[float, list[tuple[int, float]]]] = field(default_factory=dict)
    updated: float = 0.0
    born: float = 0.0  # when this node first heard of the job (its counters' birth at zero)

    def add(self, kind: str, seconds: float) -> None:
        """Book an interval; one that ended before it began is counted as such, not booked
        (its boundaries came from two clocks, or datagrams arrived out of order)."""
        if seconds > 0:
            self.totals[kind] += seconds
            if kind in KINDS:
                self.totals["wall"] += seconds
        elif seconds < 0:
            self.totals[NEGATIVE] += 1

    def to_json(self) -> dict[str, Any]:
        return {"totals": self.totals, "incarnation": self.incarnation,
                "ranks": {str(r): asdict(e) for r, e in self.ranks.items()},
                "retired": self.retired, "previous_end": self.previous_end,
                "previous_ranks": {str(r): [g, m] for r, (g, m) in self.previous_ranks.items()},
                "updated": self.updated,
                "born": self.born}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobLedger:
        job = cls()
        job.totals.update({k: float(v) for k, v in data.get("totals", {}).items()
                           if k in job.totals})
        job.incarnation = str(data.get("incarnation", ""))
        job.ranks = {int(r): RankEntry(**{**e, "marks": [(int(s), float(v))
                                                         for s, v in e["marks"]]})
                     for r, e in data.get("ranks", {}).items()}
        job.retired = [str(i) for i in data.get("retired", [])]
        job.previous_end = data.get("previous_end")
        job.previous_ranks = {int(r): (float(g), [(int(s), float(v)) for s, v in m])
                              for r, (g, m) in data.get("previous_ranks", {}).items()}
        job.updated = float(data.get("updated", 0.0))
        job.born = float(data.get("born", 0.0))
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
    """The node's goodput counters per job. Thread-safe; durable with a LedgerFile.

    Reading (`totals`, `rank_seconds`, `jobs`) changes nothing; the collector calls the two
    commands before it serves: `settle` (close incarnations that went silent) and `flush`
    (write what changed)."""

    def __init__(self, file: LedgerFile | None = None, wall: Callable[[], float] = time.time,
                 *, end_after: float = 30.0, zero_hold: float = ZERO_HOLD_SECONDS) -> None:
        self._lock = threading.Lock()
        self._file = file
        self._wall = wall
        self._end_after = end_after
        self._zero_hold = zero_hold
        self._jobs: dict[str, JobLedger] = file.load() if file is not None else {}
        self._dirty: set[str] = set()
        self._removed: set[str] = set()

    def ingest(self, job_name: str, incarnation: str, rank: int, finished: bool,
               g: RankGoodput, heartbeat: float) -> None:
        """Add what one datagram of a rank says, received at `heartbeat` on the exporter's
        clock (called by the store's receiver thread)."""
        if not incarnation:
            return
        # The process start on the exporter's clock: the rank's age is measured on the rank's
        # monotonic clock, the receipt on ours; the rank's wall clock is never read.
        start = heartbeat - g.age
        with self._lock:
            job = self._jobs.get(job_name)
            if job is None:
                if len(self._jobs) >= MAX_LEDGER_JOBS:
                    return
                job = self._jobs[job_name] = JobLedger(born=self._wall())
            if incarnation in job.retired:
                return  # a departed rank's last datagrams: its seconds were closed already
            if incarnation != job.incarnation:
                self._next_incarnation(job, incarnation)
            entry = job.ranks.get(rank)
            if entry is not None and (g.age + 0.5 < entry.age or start > entry.start + 2.0):
                # Another process under the same incarnation id (a relaunch whose id is
                # derived from an unchanged environment): close the old one like an
                # incarnation's end, for this rank, and count the new one from 0.
                job.add("unattributed" if entry.finished else "stall",
                        entry.heartbeat - entry.closed_end)
                job.add("downtime", start - entry.heartbeat)
                joining, handed = entry.joining, entry.handed  # its slot's discard still due
                entry = job.ranks[rank] = RankEntry.fresh(start, heartbeat)
                entry.joining, entry.handed = joining, handed
            elif entry is not None and entry.settled:
                # Back after `end_after` of silence (a stopped process): its trailing seconds
                # up to the last heartbeat were booked as stall; the silence since is stall
                # too, and the rank's own values continue from here.
                entry.settled = False
                job.add("stall", entry.start + g.counted - entry.closed_end)
                entry.seen = {**{k: g.seconds[k] for k in RANK_KINDS},
                              "discarded": g.discarded}
            if entry is None:
                entry = job.ranks[rank] = RankEntry.fresh(start, heartbeat)
                self._join(job, rank, entry, g.previous)
            entry.start = min(entry.start, start)  # the least delayed datagram places it best
            for kind in RANK_KINDS:
                job.add(kind, g.seconds[kind] - entry.seen[kind])
                entry.seen[kind] = max(entry.seen[kind], g.seconds[kind])
            job.add("discarded_rollback", g.discarded - entry.seen["discarded"])
            entry.seen["discarded"] = max(entry.seen["discarded"], g.discarded)
            job.totals[NEGATIVE] += max(0, g.negative - entry.negative)
            entry.negative = max(entry.negative, g.negative)
            entry.closed_end = max(entry.closed_end, entry.start + g.counted)
            entry.heartbeat = max(entry.heartbeat, heartbeat)
            entry.age = g.age
            entry.finished = finished
            entry.goodput, entry.marks = g.goodput, list(g.marks)
            if entry.joining and g.resumed is not None:
                self._discard_restart(job, rank, entry, g.resumed, g.previous)
            job.updated = self._wall()
            self._dirty.add(job_name)

    @staticmethod
    def _join(job: JobLedger, rank: int, entry: RankEntry, previous: Handoff | None) -> None:
        """Book a new rank's gap (downtime) since its slot's rank before it, once per slot.

        Where this node saw that rank (the incarnation the new rank's handoff follows, or,
        without a handoff to say which, any earlier one here): from that incarnation's end
        here, unless the old rank's own record ends later (this node's exporter was down
        when it ended: `_unseen_end`). Otherwise (the slot moved here from another node, or
        the job comes back after running elsewhere): the handoff's gap, which the node that
        saw the old rank never books. With neither: nothing."""
        if previous is not None and previous.incarnation == job.incarnation:
            previous = None  # the handoff of this very incarnation: nothing to hand over
        before = job.retired[-1] if job.retired else None
        if previous is not None and previous.incarnation != before:
            # the job ran elsewhere since it was here: this node's record of its end and its
            # ranks is of an older incarnation, for no slot to use (nor one without a handoff)
            job.previous_end, job.previous_ranks = None, {}
        entry.joining = True
        if job.previous_end is not None and (
                previous is None or rank in job.previous_ranks):
            if previous is not None and Ledger._unseen_end(job, rank, entry, previous,
                                                           job.previous_end):
                entry.handed = True
            else:
                job.add("downtime", entry.start - job.previous_end)
        elif previous is not None:
            entry.handed = True
            job.add("downtime", previous.downtime)
            job.previous_ranks.pop(rank, None)  # another rank's slot here before: not this one
        else:
            entry.joining = False

    @staticmethod
    def _unseen_end(job: JobLedger, rank: int, entry: RankEntry, previous: Handoff,
                    end: float) -> bool:
        """Book the end of the slot's old rank that this node did not hear, where its own
        record (the handoff's view, of the incarnation this node saw last) ends more than
        HANDOFF_NEWER_SECONDS after this node's last heartbeat of it, `end`: its exporter
        was down, or lost its last datagrams. The seconds from `end` to the record's end
        are the old rank's: productive up to the kept progress its record adds to what this
        node saw (its own cumulative `goodput`), unattributed beyond (which other kinds
        they were, the record does not say); the gap is the handoff's; the restart's
        discard will be the handoff's too (from the record's progress and marks, not this
        node's older ones). Together exactly this node's own gap, `end` to the new rank's
        start, so the wall is unchanged. False (nothing booked): this node's view stands."""
        if previous.downtime < 0:
            return False  # a record that ends after the new process started: not newer
        record_end = entry.start - previous.downtime  # on this node's clock: one node
        unseen = record_end - end
        if unseen <= HANDOFF_NEWER_SECONDS:
            return False
        kept, _marks = job.previous_ranks.pop(rank)
        progress = (0.0 if previous.goodput is None
                    else min(unseen, max(0.0, previous.goodput - kept)))
        job.add(PRODUCTIVE, progress)
        job.add("unattributed", unseen - progress)
        job.add("downtime", previous.downtime)
        return True

    @staticmethod
    def _discard_restart(job: JobLedger, rank: int, entry: RankEntry, resumed: int,
                         previous: Handoff | None) -> None:
        """The slot's old rank's kept progress beyond the checkpoint the new one resumed from,
        once: from this node's record of it, or from the handoff where the slot moved or
        the old rank's record saw more of it (`_unseen_end`)."""
        entry.joining = False
        if entry.handed:
            if previous is not None and previous.discarded is not None:
                job.add("discarded_restart", previous.discarded)
            return
        kept_marks = job.previous_ranks.pop(rank, None)
        if kept_marks is not None:
            kept, marks = kept_marks
            job.add("discarded_restart", max(0.0, kept - mark_at(marks, resumed)))

    @staticmethod
    def _close(job: JobLedger, entry: RankEntry, end: float) -> None:
        """Book a rank's seconds after its last report up to `end`: stall (unattributed after
        a clean finish), once."""
        job.add("unattributed" if entry.finished else "stall", end - entry.closed_end)
        entry.closed_end = max(entry.closed_end, end)

    def _next_incarnation(self, job: JobLedger, incarnation: str) -> None:
        """Close the current incarnation's ranks up to its last heartbeat."""
        if job.incarnation:
            job.retired = [*job.retired, job.incarnation][-16:]
        if job.ranks:
            end = max(e.heartbeat for e in job.ranks.values())
            for entry in job.ranks.values():
                self._close(job, entry, end)
            job.previous_end = end
            job.previous_ranks = {r: (e.goodput, e.marks) for r, e in job.ranks.items()}
        job.incarnation = incarnation
        job.ranks = {}

    def settle(self) -> None:
        """Book the last interval of incarnations that ended for good (every rank silent for
        `end_after`: killed, hung then killed, never relaunched): up to the incarnation's last
        heartbeat, as the next incarnation would. A relaunch later adds only its downtime."""
        now = self._wall()
        with self._lock:
            for name, job in self._jobs.items():
                live = [e for e in job.ranks.values() if not e.settled]
                if not live or now - max(e.heartbeat for e in job.ranks.values()) < \
                        self._end_after:
                    continue
                end = max(e.heartbeat for e in job.ranks.values())
                for entry in live:
                    self._close(job, entry, end)
                    entry.settled = True
                self._dirty.add(name)

    def jobs(self) -> list[str]:
        """Every job the ledger keeps (its series outlive the job's gaps between incarnations
        for as long as it is kept)."""
        with self._lock:
            return list(self._jobs)

    def rank_seconds(self, names: Iterable[str]) -> dict[str, dict[int, dict[str, float]]]:
        """Each current rank's own cumulative seconds of PER_RANK_CAUSES, by job (a new
        incarnation's ranks count again from 0, as every per-rank counter does)."""
        with self._lock:
            return {n: {r: {k: e.seen[k] for k in PER_RANK_CAUSES}
                        for r, e in self._jobs[n].ranks.items()}
                    for n in names if n in self._jobs}

    def totals(self, names: Iterable[str]) -> dict[str, dict[str, float]]:
        """The counters of the named jobs; a job born less than `zero_hold` ago reads all
        zero (its birth). Call `flush` first when they are to be served: a value once served
        must never be lost by a restart, or it would go backwards."""
        now = self._wall()
        with self._lock:
            return {n: (dict(j.totals) if now - j.born >= self._zero_hold
                        else dict.fromkeys(j.totals, 0.0))
                    for n in names if (j := self._jobs.get(n)) is not None}

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
