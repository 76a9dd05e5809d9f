"""A rank killed without a word, noticed within a second by the exporter on its node.

A rank process that ends says so in its last datagram: `finished` on a clean end, `exiting`
when it ends on an error (an exception, often a collective that raised because a peer died,
or the SIGTERM of the scheduler stopping it: exporters/rank/departure.py). A rank killed by
SIGKILL or the OOM killer says nothing; the rule TrainingJobVanished names it minutes later
(its heartbeat stopped first). This watch sees the process itself end (senders.py: the
kernel's credentials of each rank's datagrams; peers.py: the pid with its start time), so
the exporter can post the same alert at once (the server wires it to fast_alerts.FastAlerts).

Only the first killed rank of a launch (job name and incarnation) on this node is reported:
the scheduler kills the others right after, and they are consequences. A rank whose process
is gone is judged only after every datagram already queued on the socket has been read (the
receiver drains it first), so a rank's last word sent just before it died is never missed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainwatch.exporters.contract.wire import RankReport
from trainwatch.exporters.node.training import peers
from trainwatch.exporters.node.training.store import SILENT, Store

CHECK_EVERY_SECONDS = 0.5
MAX_WATCHED = 4096  # processes; a node runs a few dozen ranks, this bounds a flood of names


@dataclass(frozen=True)
class KilledRank:
    """A rank whose process ended without a clean finish or an error of its own."""

    job: str
    incarnation: str
    rank: int
    pid: int


@dataclass(frozen=True)
class Watched:
    job: str
    incarnation: str
    rank: int
    process: peers.Process


class RankWatch:
    """The processes of the ranks that report here, and who of them was killed first.

    Used from the receiver thread only (no lock): `saw` after each datagram, `ended` at most
    every `every` seconds, `judge` on what `ended` returned once the socket is drained."""

    def __init__(self, store: Store, on_killed: Callable[[KilledRank], None], *,
                 every: float = CHECK_EVERY_SECONDS, proc: Path = Path("/proc"),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._on_killed = on_killed
        self._every = every
        self._proc = proc
        self._clock = clock
        self._next = clock()
        self._watched: dict[tuple[str, int], Watched] = {}
        # launches (job, incarnation) whose killed rank was reported; forgotten once none of
        # their processes is watched any more (the launch is over here)
        self._reported: set[tuple[str, str]] = set()
        self.killed = 0  # killed ranks seen, reported or not (consequences)

    def saw(self, report: RankReport, process: peers.Process | None) -> None:
        """A datagram of `report.rank` came from `process` (the kernel's word, senders.py);
        None: not visible from here, or gone already (the rules' case)."""
        if process is None:
            return
        key = (report.job, report.rank)
        known = self._watched.get(key)
        if known is not None and known.process == process \
                and known.incarnation == report.incarnation:
            return
        # A new rank or launch: the sender lookup is cached for seconds, so make sure this is
        # the process running now (not one whose pid was reused meanwhile) before watching it.
        if not peers.alive(process, self._proc):
            return
        if known is None and len(self._watched) >= MAX_WATCHED:
            return
        self._watched[key] = Watched(report.job, report.incarnation, report.rank, process)

    def due(self) -> bool:
        return self._clock() >= self._next

    def ended(self) -> list[Watched]:
        """The watched processes that are gone (checked now; next check in `every`)."""
        self._next = self._clock() + self._every
        return [w for w in self._watched.values() if not peers.alive(w.process, self._proc)]

    def judge(self, ended: list[Watched]) -> None:
        """Report the first killed rank of each launch among `ended`, and stop watching them.
        Call after the datagrams queued before the check were ingested."""
        for watched in ended:
            key = (watched.job, watched.rank)
            if self._watched.get(key) is not watched:
                continue  # replaced by a newer process of the rank meanwhile
            del self._watched[key]
            word = self._store.rank_word(watched.job, watched.incarnation, watched.rank)
            if word != SILENT:
                continue  # finished, ended on its own error, or no longer of the launch here
            self.killed += 1
            launch = (watched.job, watched.incarnation)
            if launch in self._reported:
                continue
            self._reported.add(launch)
            self._on_killed(KilledRank(watched.job, watched.incarnation, watched.rank,
                                       watched.process.pid))
        running = {(w.job, w.incarnation) for w in self._watched.values()}
        self._reported &= running
