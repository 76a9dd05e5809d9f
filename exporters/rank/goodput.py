"""Goodput on the rank: the process's own timeline from its start, cut at every step report.

`RankAccount` is run by the shipper thread, never the training thread. Each interval between
two reports is split into data wait (what the loop reported), checkpoint save and restore (time
the training thread spent inside the CheckpointManager, recorded by `blocking`), and the rest:
startup in the first interval, stall for the part of an interval beyond `STALL_STEP_FACTOR` x
the rank's median step (and at least `STALL_FLOOR_SECONDS`), productive otherwise. A rollback
discards the productive seconds of the steps it threw away: the rank's kept progress
("goodput") at the restored checkpoint is remembered at every save (`marks`). Everything is
cumulative and rides in every datagram (`trainwatch.exporters.contract.goodput`), so a lost
datagram or an exporter that was down loses nothing.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from trainwatch.exporters.contract.goodput import (
    MAX_MARKS,
    PRODUCTIVE,
    RANK_KINDS,
    mark_at,
    parse_handoff,
)
from trainwatch.exporters.rank import lineage

# A step interval is a stall when its time outside data wait and checkpoints exceeds
# max(STALL_STEP_FACTOR x the median of the rank's last STALL_WINDOW steps, STALL_FLOOR_SECONDS);
# the part beyond the median step is stall, the median itself productive.
STALL_STEP_FACTOR = 10.0
STALL_FLOOR_SECONDS = 5.0
STALL_WINDOW = 64
STALL_MIN_STEPS = 5
# Checkpoint event kinds recorded by `blocking` (CheckpointManager methods).
SAVE, RESTORE = "save", "restore"
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
                wake = local.get("goodput_wake")
                if wake is not None:
                    wake()
        return timed  # type: ignore[return-value]
    return wrap


def process_age() -> float | None:
    """Seconds since this process started, measured on the kernel's monotonic boot clock
    (/proc, 10 ms resolution), never on the wall clock; None where /proc is absent."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _valid_handoff(handoff: dict[str, Any]) -> dict[str, Any] | None:
    """The handoff as the datagram carries it, or None where the exporter would refuse it."""
    try:
        parse_handoff(handoff)
    except ValueError:
        return None
    return handoff


def _median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class RankAccount:
    """One rank's timeline, cut at its step reports. Used by one thread (the shipper)."""

    def __init__(self, start_perf: float, checkpoints: Any = None, local_rank: int = 0,
                 job: str = "") -> None:
        self._start_perf = start_perf
        self._closed = start_perf  # perf_counter time up to which every second is counted
        self._checkpoints = checkpoints
        # The slot's record in the job's checkpoint directory (lineage.py): with a
        # CheckpointManager only, which knows the directory every node of the job mounts.
        directory = getattr(checkpoints, "directory", None)
        self._record = (lineage.RecordWriter(
            Path(directory), job, int(getattr(checkpoints, "rank", 0)), local_rank,
            lineage.local_world_size(),
            lineage.record_interval(int(getattr(checkpoints, "world_size", 1))))
            if directory is not None else None)
        # The handoff from the slot's rank before this process (lineage.py): its gap from the
        # first datagram, the discard once this process has resumed (its first step). Only
        # this job's (another job may have used the directory before) and only what the
        # datagram's contract accepts (a record is data: never a reason to lose the reports).
        predecessor = getattr(checkpoints, "predecessor", None)
        self._predecessor = (predecessor if isinstance(predecessor, lineage.Predecessor)
                             and predecessor.job == job else None)
        self.previous: dict[str, Any] | None = None
        if self._predecessor is not None:
            start_wall = time.time() - (time.perf_counter() - start_perf)
            self.previous = _valid_handoff(self._predecessor.handoff(start_wall))
        self._event_seq = 0  # newest checkpoint event consumed
        self._marked_seq = 0  # newest save whose mark was taken before it was consumed
        self.seconds = dict.fromkeys(RANK_KINDS, 0.0)
        self.discarded = 0.0  # by rollbacks, within this process
        self.goodput = 0.0  # productive - discarded: this process's kept progress
        self.marks: deque[tuple[int, float]] = deque(maxlen=MAX_MARKS)
        self.resumed: int | None = None  # checkpoint step resumed from at start; -1: none
        self.negative = 0  # intervals that ended before they began (counted, not booked)
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
                if step is not None and seq > self._marked_seq:
                    self.marks.append((step, self.goodput))
            else:
                restore += seconds
                if step is not None:  # None: the restore failed and changed nothing
                    self._restored(step)
        return save, restore

    def mark_saves(self, drained: Callable[[], bool]) -> bool:
        """Take the checkpoint marks of saves that ended after the last step report, before
        the next report consumes them; True when one was added (ship it now).

        Why: a mark otherwise waits for the next step's report, and a rank killed in between
        (a fatal XID, a SIGKILL right after a save) leaves the exporter without the mark its
        restart resumes from, so the work up to the checkpoint is booked as discarded.
        `drained()` must say the step reports queued before the save are all counted (the
        queue is empty after the events were read): only then is `goodput` the value at the
        save. A restore stops the scan; the next step report applies it in order."""
        events = getattr(self._checkpoints, "goodput_events", None)
        done = max(self._event_seq, self._marked_seq)
        if not events or events[-1][0] <= done:
            return False
        pending = [e for e in list(events) if e[0] > done]
        if not drained():
            return False
        added = False
        for seq, kind, _start, _end, step in pending:
            if kind != SAVE:
                break
            self._marked_seq = seq
            if step is not None:
                self.marks.append((step, self.goodput))
                added = True
        return added

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
            self.negative += 1
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
            if self._predecessor is not None and self.previous is not None:
                self.previous = _valid_handoff({
                    **self.previous, "discarded": self._predecessor.discarded(self.resumed)})
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

    def keep_record(self, incarnation: str, force: bool = False) -> None:
        """Rewrite the slot's record (after a datagram; `force`: the last one)."""
        if self._record is not None:
            self._record.keep(incarnation, self.goodput, list(self.marks), force=force)

    def wire(self, now: float) -> dict[str, Any]:
        """The cumulative values a datagram sent at perf_counter time `now` carries (see
        trainwatch.exporters.contract.goodput.parse)."""
        return {"age": now - self._start_perf, "negative": self.negative,
                "seconds": [self.seconds[k] for k in RANK_KINDS],
                "discarded": self.discarded, "goodput": self.goodput,
                "marks": [list(m) for m in self.marks], "resumed": self.resumed,
                "previous": self.previous}
