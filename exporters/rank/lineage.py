"""A job's slots across incarnations: what the exporter of a slot's next rank cannot see.

A restart's downtime and the work it threw away are counted per slot (a rank number) by the
node exporter of the slot's next rank: from the old rank's last report to the new rank's start,
and the old rank's kept progress beyond the checkpoint the new one resumed from. When the slot
stays on its node, that exporter saw the old rank and counts it itself. When the slot moves (a
quarantined node, a spare in its place) the old rank reported to another node's exporter, and
only the job's checkpoint directory, which every node of the job mounts, joins the two. So
every rank keeps a small record of itself there, `lineage/rank-<r>.json` (its incarnation,
host, the time of its last report, its kept progress and checkpoint marks), rewritten after a
datagram (at most every `record_interval`) and after its last one; and the next rank of the
slot reads it before its first step and sends what it implies (`handoff`): the incarnation it
follows, the gap, the discarded seconds. The node exporter uses it only where it did not see
the old rank itself (trainwatch.exporters.node.training.ledger).

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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwatch.exporters.contract.atomic_file import atomic_write_json
from trainwatch.exporters.contract.goodput import MAX_MARKS, mark_at

log = logging.getLogger(__name__)

DIRECTORY = "lineage"
# How often a rank rewrites its record while it reports (after a datagram): the most a killed
# slot's gap can be overstated by. A small job rewrites after every datagram; a large one
# keeps the job's whole rate of renames on its filesystem under RECORDS_PER_SECOND, so each
# rank's interval grows with the world size (at 16,384 ranks, 33 s: a few moved slots' error
# against the downtime of every slot of the job).
RECORD_SECONDS = 0.2
RECORDS_PER_SECOND = 500.0


def record_interval(world_size: int) -> float:
    return max(RECORD_SECONDS, world_size / RECORDS_PER_SECOND)

MAX_LOCAL_WORLD = 1024  # node-mates read at start, at most (a record is data, not trusted)
VERSION = 1


def record_path(directory: Path, rank: int) -> Path:
    return Path(directory) / DIRECTORY / f"rank-{rank}.json"


def local_world_size(env: dict[str, str] | None = None) -> int:
    """Ranks on this node: torchrun's LOCAL_WORLD_SIZE, else srun's tasks per node, else 1."""
    env = dict(os.environ) if env is None else env
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = env.get(name, "").split("(")[0]
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


@dataclass(frozen=True)
class Record:
    """One rank's record of itself, as read back (validated)."""

    incarnation: str
    host: str
    local_rank: int
    local_world: int
    end: float
    goodput: float
    marks: tuple[tuple[int, float], ...]


def _read(directory: Path, rank: int) -> Record | None:
    """A rank's record, or None when there is none or it is not one (never raises)."""
    try:
        doc = json.loads(record_path(directory, rank).read_bytes())
        marks = tuple((int(s), float(v)) for s, v in doc["marks"][:MAX_MARKS])
        record = Record(str(doc["incarnation"]), str(doc["host"]), int(doc["local_rank"]),
                        int(doc["local_world"]), float(doc["end"]), float(doc["goodput"]),
                        marks)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (not record.incarnation or not 0 <= record.local_rank < record.local_world
            or record.local_world > MAX_LOCAL_WORLD or not math.isfinite(record.end)
            or not math.isfinite(record.goodput) or record.goodput < 0):
        return None
    return record


@dataclass(frozen=True)
class Predecessor:
    """The slot's rank in the incarnation before this one, as its records tell."""

    incarnation: str
    end: float  # the last report among it and its node-mates (their wall clock)
    goodput: float
    marks: tuple[tuple[int, float], ...]

    def handoff(self, start_wall: float) -> dict[str, Any]:
        """What the slot's new rank sends from its first datagram: the incarnation it follows
        and the gap to its own start (`discarded` follows once it has resumed)."""
        return {"incarnation": self.incarnation, "downtime": start_wall - self.end,
                "discarded": None}

    def discarded(self, resumed: int) -> float:
        """The old rank's kept progress beyond the checkpoint resumed from (all of it when
        none was: -1)."""
        return max(0.0, self.goodput - mark_at(list(self.marks), resumed))


def read_predecessor(directory: Path, rank: int) -> Predecessor | None:
    """Read before this incarnation's first step (the CheckpointManager's constructor, before
    its barrier: no rank of this incarnation has written yet). The slot's record counts only
    when it belongs to the incarnation rank 0's record names (rank 0 exists in every
    incarnation), so a slot that an intermediate incarnation did not have is not handed a
    stale record."""
    reference = _read(directory, 0)
    own = reference if rank == 0 else _read(directory, rank)
    if reference is None or own is None or own.incarnation != reference.incarnation:
        return None
    ends = [own.end]
    first = rank - own.local_rank
    for mate in range(max(0, first), first + own.local_world):
        if mate != rank and (other := _read(directory, mate)) is not None \
                and other.incarnation == own.incarnation and other.host == own.host:
            ends.append(other.end)
    return Predecessor(own.incarnation, max(ends), own.goodput, own.marks)


class RecordWriter:
    """Rewrites one rank's record; used by the shipper thread only. A failed write is logged
    once and never reaches training."""

    def __init__(self, directory: Path, rank: int, local_rank: int, local_world: int,
                 interval: float = RECORD_SECONDS) -> None:
        # a datagram every flush interval (0.2 s) when stepping: a rewrite after each one, not
        # every other one because of the thread's wake-up jitter
        interval *= 0.75
        self._path = record_path(directory, rank)
        self._static = {"v": VERSION, "host": socket.gethostname(), "local_rank": local_rank,
                        "local_world": max(local_world, local_rank + 1)}
        self._interval = interval
        self._last = -math.inf
        self._warned = False

    def keep(self, incarnation: str, goodput: float, marks: list[tuple[int, float]], *,
             force: bool = False) -> None:
        now = time.monotonic()
        if not incarnation or (not force and now - self._last < self._interval):
            return
        self._last = now
        try:
            self._path.parent.mkdir(exist_ok=True)
            atomic_write_json(self._path, {**self._static, "incarnation": incarnation,
                                           "end": time.time(), "goodput": goodput,
                                           "marks": [list(m) for m in marks]},
                              durable=False)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("trainwatch: cannot keep the goodput record %s (a restart on "
                            "other nodes will not count this rank's downtime): %s",
                            self._path, exc)
