"""Goodput: what both sides agree on (docs/goodput.md): the partition of a job's wall time
into kinds, the causes of discarded seconds, and the rank's cumulative values as a datagram
carries them.

The rank counts its own timeline (`trainwatch.exporters.rank.goodput.RankAccount`, on the
shipper thread); the node exporter adds every rank's values up per job and counts what no rank
can see itself (`trainwatch.exporters.node.training.ledger.Ledger`). Every second lands in
exactly one kind (`KINDS`); wall is their sum, so the parts add up by construction. Discarded
seconds are a part of productive ones (productive - discarded = goodput), so no counter ever has
to decrease.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainwatch.exporters.contract.identity import INCARNATION_PATTERN

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
MAX_MARKS = 16  # checkpoint marks a datagram carries (a restart resumes from one of them)


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
    """A rank's cumulative goodput values, as one datagram carried them (validated).

    Times are durations on the rank's monotonic clock; the rank sends no wall time. The
    exporter places them on its own clock (one clock per interval): the process started `age`
    seconds before the exporter received the datagram, and the rank has counted its seconds up
    to `counted` seconds after that start."""

    age: float  # seconds since the process started, when the datagram was sent
    seconds: dict[str, float]
    discarded: float
    goodput: float
    marks: list[tuple[int, float]]
    resumed: int | None
    negative: int = 0  # intervals the rank found negative (counted, not booked)
    previous: Handoff | None = None  # what the slot's rank before this one left (lineage)

    @property
    def counted(self) -> float:
        """Seconds from the process start up to the rank's last report."""
        return sum(self.seconds.values())


# A handoff's gap or discard beyond this is not a restart's (records older than a week are not
# predecessors: trainwatch.exporters.rank.lineage), and never booked into a counter for good.
MAX_HANDOFF_SECONDS = 7 * 86400.0


@dataclass(frozen=True)
class Handoff:
    """What a rank says of its slot's rank in the previous incarnation, from the record that
    rank kept in the job's checkpoint directory (trainwatch.exporters.rank.lineage): the
    exporter books it only where it did not see that rank itself (a slot that moved nodes)."""

    incarnation: str
    downtime: float  # old rank's last report -> this process's start (may be < 0: clocks)
    # the old rank's kept progress beyond the checkpoint resumed from; None until this rank
    # has resumed (its first step)
    discarded: float | None
    # the old rank's kept progress at its record's end (None from a rank that predates it):
    # what it made after the last datagram its exporter heard, where that exporter was down
    goodput: float | None = None


def parse_handoff(obj: Any) -> Handoff | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise ValueError("goodput previous must be an object or null")
    incarnation, downtime = obj.get("incarnation"), obj.get("downtime")
    if (not isinstance(incarnation, str) or not incarnation
            or not INCARNATION_PATTERN.match(incarnation)):
        raise ValueError("goodput previous incarnation must be an incarnation id")
    if (not isinstance(downtime, (int, float)) or isinstance(downtime, bool)
            or not math.isfinite(downtime) or abs(downtime) > MAX_HANDOFF_SECONDS):
        raise ValueError("goodput previous downtime must be a finite number of seconds")
    discarded = obj.get("discarded")
    if discarded is not None and _nonneg(discarded) > MAX_HANDOFF_SECONDS:
        raise ValueError("goodput previous discarded is out of range")
    goodput = obj.get("goodput")
    return Handoff(incarnation, float(downtime),
                   None if discarded is None else _nonneg(discarded),
                   None if goodput is None else _nonneg(goodput))


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
    negative = obj.get("negative", 0)
    if not isinstance(negative, int) or isinstance(negative, bool) or negative < 0:
        raise ValueError("goodput negative must be a count")
    parsed = {k: _nonneg(v) for k, v in zip(RANK_KINDS, seconds, strict=True)}
    age = _nonneg(obj.get("age"))
    if sum(parsed.values()) > age + 1.0:
        raise ValueError("goodput seconds exceed the process's age")
    return RankGoodput(age=age, seconds=parsed, discarded=_nonneg(obj.get("discarded", 0)),
                       goodput=_nonneg(obj.get("goodput", 0)), marks=parsed_marks,
                       resumed=resumed, negative=negative,
                       previous=parse_handoff(obj.get("previous")))
