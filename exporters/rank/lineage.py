"""A job's slots across incarnations: what the exporter of a slot's next rank cannot see.

A restart's downtime and the work it threw away are counted per slot (a rank number) by the
node exporter of the slot's next rank: from the old rank's last report to the new rank's start,
and the old rank's kept progress beyond the checkpoint the new one resumed from. When the slot
stays on its node, that exporter saw the old rank and counts it itself. When the slot moves (a
quarantined node, a spare in its place) the old rank reported to another node's exporter, and
only the job's checkpoint directory, which every node of the job mounts, joins the two. So
every rank keeps a small record of itself there, `lineage/rank-<r>.json` (its job and
incarnation, host, the time of its last report, its kept progress and checkpoint marks),
rewritten after a datagram went out (at most every `record_interval`, on a thread of its own)
and after its last one; and the next rank of the slot reads it before its first step and
sends what it implies (`handoff`): the incarnation it follows, the gap, the old rank's kept
progress at its end and the discarded seconds. The node exporter uses it where it did not see
the old rank itself, or saw less of it than the record did (its exporter was down when it
ended) (trainwatch.exporters.node.training.ledger).

The old rank's "end" is the newest record of the ranks that shared its node in that
incarnation (its exporter closes all of them at the last one it heard of), so a killed rank's
slot is not counted twice while its node-mates lived on. Times in records are the writing
node's wall clock: a slot that moved is measured across two nodes' clocks (the only interval
that is; NTP keeps them within milliseconds, as Slurm's and munge's credentials need anyway).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwatch.exporters.contract.atomic_file import atomic_write_json
from trainwatch.exporters.contract.goodput import MAX_MARKS, mark_at
from trainwatch.exporters.contract.identity import INCARNATION_PATTERN

log = logging.getLogger(__name__)

DIRECTORY = "lineage"
# How often a rank rewrites its record while it reports: the most a killed slot's gap can be
# overstated by. A small job rewrites after every datagram (one every 0.2 s while it steps);
# a large one keeps the job's whole rate of renames on its filesystem under
# RECORDS_PER_SECOND, so each rank's interval grows with the world size (at 16,384 ranks,
# 33 s: a few moved slots' error against the downtime of every slot of the job). A new
# checkpoint mark is written at once whatever the interval (a restart resumes from it).
RECORD_SECONDS = 0.15
RECORDS_PER_SECOND = 500.0
MAX_LOCAL_WORLD = 1024  # node-mates read at start, at most (a record is data, not trusted)
MAX_RECORD_BYTES = 64 * 1024
# A record older than this, or ahead of this node's clock by more than the skew, is not a
# predecessor: an earlier job that used the same directory, or a clock far off.
MAX_RECORD_AGE_SECONDS = 7 * 86400
MAX_CLOCK_SKEW_SECONDS = 300.0
FINAL_WRITE_SECONDS = 1.0  # how long the last record (a closing rank's) may take
VERSION = 1


def record_interval(world_size: int) -> float:
    return max(RECORD_SECONDS, world_size / RECORDS_PER_SECOND)


def record_path(directory: Path, rank: int) -> Path:
    return Path(directory) / DIRECTORY / f"rank-{rank}.json"


def local_world_size(env: dict[str, str] | None = None) -> int:
    """Ranks on this node: torchrun's LOCAL_WORLD_SIZE, else this step's or job's tasks on
    this node from Slurm (the first node's count of a list like "2(x3),1"), else 1."""
    env = dict(os.environ) if env is None else env
    for name in ("LOCAL_WORLD_SIZE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                 "SLURM_NTASKS_PER_NODE"):
        value = env.get(name, "").split(",")[0].split("(")[0]
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


@dataclass(frozen=True)
class Record:
    """One rank's record of itself, as read back (validated)."""

    job: str
    incarnation: str
    host: str
    local_rank: int
    local_world: int
    end: float
    goodput: float
    marks: tuple[tuple[int, float], ...]


def _load(path: Path) -> Any:
    """The JSON document at `path`: a regular file, not followed through a link, at most
    MAX_RECORD_BYTES, never waited on (a FIFO in its place)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = os.read(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError("record too large")
    return json.loads(data)


def _finite(value: Any) -> float:
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError("not a finite number >= 0")
    return number


def _read(directory: Path, rank: int, now: float) -> Record | None:
    """A rank's record, or None when there is none or it is not one: a record is data
    another process wrote, so nothing in it may stop a job from starting."""
    try:
        doc = _load(record_path(directory, rank))
        if doc.get("v") != VERSION:
            return None
        marks = tuple((int(s), _finite(v)) for s, v in doc["marks"][:MAX_MARKS])
        record = Record(str(doc["job"]), str(doc["incarnation"]), str(doc["host"]),
                        int(doc["local_rank"]), int(doc["local_world"]), _finite(doc["end"]),
                        _finite(doc["goodput"]), marks)
    except Exception:  # any malformed or hostile record reads as none
        return None
    if (not record.incarnation or not INCARNATION_PATTERN.match(record.incarnation)
            or not 0 <= record.local_rank < record.local_world <= MAX_LOCAL_WORLD
            or any(step < 0 for step, _ in record.marks)
            or not now - MAX_RECORD_AGE_SECONDS < record.end < now + MAX_CLOCK_SKEW_SECONDS):
        return None
    return record


@dataclass(frozen=True)
class Predecessor:
    """The slot's rank in the incarnation before this one, as its records tell."""

    job: str
    incarnation: str
    end: float  # the last report among it and its node-mates (their wall clock)
    goodput: float
    marks: tuple[tuple[int, float], ...]

    def handoff(self, start_wall: float) -> dict[str, Any]:
        """What the slot's new rank sends from its first datagram: the incarnation it follows,
        the gap to its own start and the old rank's kept progress at its end (`discarded`
        follows once it has resumed)."""
        return {"incarnation": self.incarnation, "downtime": start_wall - self.end,
                "discarded": None, "goodput": self.goodput}

    def discarded(self, resumed: int) -> float:
        """The old rank's kept progress beyond the checkpoint resumed from (all of it when
        none was: -1)."""
        return max(0.0, self.goodput - mark_at(list(self.marks), resumed))


def read_predecessor(directory: Path, rank: int) -> Predecessor | None:
    """Read before this incarnation's first step (the CheckpointManager's constructor, before
    its barrier: no rank of this incarnation has written yet). The slot's record counts only
    when it belongs to the incarnation rank 0's record names (rank 0 exists in every
    incarnation), so a slot that an intermediate incarnation did not have is not handed a
    stale record; the job it names is checked by the rank (RankAccount), which knows its own."""
    now = time.time()
    reference = _read(directory, 0, now)
    own = reference if rank == 0 else _read(directory, rank, now)
    if reference is None or own is None or own.incarnation != reference.incarnation \
            or own.job != reference.job:
        return None
    ends = [own.end]
    first = rank - own.local_rank
    for mate in range(max(0, first), first + own.local_world):
        if mate != rank and (other := _read(directory, mate, now)) is not None \
                and other.incarnation == own.incarnation and other.host == own.host:
            ends.append(other.end)
    return Predecessor(own.job, own.incarnation, max(ends), own.goodput, own.marks)


class RecordWriter:
    """Keeps one rank's record, rewritten on a daemon thread of its own: the shipper hands
    over the newest values and never waits on the job's filesystem (a slow metadata server
    would otherwise hold back its heartbeats). A write in flight is never queued behind: the
    thread writes the newest values when it is free. A failed write is logged once."""

    def __init__(self, directory: Path, job: str, rank: int, local_rank: int, local_world: int,
                 interval: float = RECORD_SECONDS) -> None:
        self._path = record_path(directory, rank)
        self._static = {"v": VERSION, "job": job, "host": socket.gethostname(),
                        "local_rank": local_rank,
                        "local_world": max(local_world, local_rank + 1)}
        self._interval = interval
        self._last = -math.inf
        self._newest_mark: tuple[int, float] | None = None  # the last record's newest mark
        self._warned = False
        self._made_directory = False
        self._cond = threading.Condition()
        self._pending: dict[str, Any] | None = None
        self._writing = False
        self._thread: threading.Thread | None = None

    def keep(self, incarnation: str, goodput: float, marks: list[tuple[int, float]], *,
             force: bool = False) -> None:
        """Hand over the newest values (after a datagram went out): written at most every
        interval, at once for a new checkpoint mark, and `force` (the last one) waited for
        up to FINAL_WRITE_SECONDS."""
        now = time.monotonic()
        # the newest mark, not the count: the list is capped, so its length stops moving
        newest = tuple(marks[-1]) if marks else None
        new_mark = newest != self._newest_mark
        if not incarnation or (not force and not new_mark and now - self._last < self._interval):
            return
        self._last, self._newest_mark = now, newest
        doc = {**self._static, "incarnation": incarnation, "end": time.time(),
               "goodput": goodput, "marks": [list(m) for m in marks]}
        with self._cond:
            self._pending = doc
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="trainwatch-record",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
            if force:
                self._cond.wait_for(lambda: self._pending is None and not self._writing,
                                    timeout=FINAL_WRITE_SECONDS)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                doc, self._pending, self._writing = self._pending, None, True
            try:
                self._write(doc)
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()

    def _write(self, doc: dict[str, Any]) -> None:
        try:
            if not self._made_directory:
                self._path.parent.mkdir(exist_ok=True)
                self._made_directory = True
            atomic_write_json(self._path, doc, durable=False)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("trainwatch: cannot keep the goodput record %s (a restart on "
                            "other nodes will not count this rank's downtime): %s",
                            self._path, exc)
