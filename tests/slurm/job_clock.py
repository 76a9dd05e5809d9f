"""The stopwatch for a job that the Slurm test cluster restarts on other nodes (issue 37,
acceptance 2 and 3): each rank process's start (the kernel's record, /proc) and end (watched
every 20 ms, or the moment the test killed it), the job's own step log, and what the Goodput
dashboard shows for it.

Slots are rank numbers: the job-level seconds of a slot run from its first process's start to
the moment of the reading, its downtime from one process's end to the next one's start, and
what a restart discarded is the productive time (step to step, less the synchronous saves in
between) the old process spent after the checkpoint the new one resumed from.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.support.net import wait_until
from tests.training.goodput_support import started_at
from tests.training.support import of
from trainwatch.exporters.node.tools.stack_dump import rank_processes

EXIT_POLL_SECONDS = 0.02


class RankClock:
    """Start and end of every rank process of one job, by slot (rank) and incarnation."""

    def __init__(self) -> None:
        self.starts: list[dict[int, float]] = []  # per incarnation: rank -> start
        self.ends: list[dict[int, float]] = []
        self._ranks: dict[int, tuple[int, int]] = {}  # pid -> (incarnation, rank)
        self._live: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def incarnation(self, job: str, nodes: Iterable[str], ranks: int) -> dict[int, str]:
        """Find the ranks of the job's current incarnation (one per node here), note their
        starts and watch their ends; rank -> node."""
        nodes = list(nodes)
        found: dict[int, tuple[int, str]] = {}

        def all_found() -> bool:
            for node in nodes:
                for proc in rank_processes(job, node):
                    if proc["pid"] not in self._ranks and proc["state"] != "Z":
                        found[int(proc["rank"])] = (proc["pid"], node)
            return len(found) == ranks

        wait_until(all_found, timeout=120, interval=0.1, what=f"{ranks} new ranks of {job}")
        index = len(self.starts)
        self.starts.append({r: started_at(pid) for r, (pid, _) in found.items()})
        self.ends.append({})
        with self._lock:
            for rank, (pid, _) in found.items():
                self._ranks[pid] = (index, rank)
                self._live.add(pid)
        return {r: node for r, (_, node) in found.items()}

    def killed(self, pid: int, at: float) -> None:
        """The test killed this process at `at` (SIGKILL: it ends then)."""
        with self._lock:
            index, rank = self._ranks[pid]
            self._live.discard(pid)
            self.ends[index][rank] = at

    def stopped(self, found: list[dict[str, Any]], index: int) -> dict[int, float]:
        """When each rank of incarnation `index` stopped training: its process's end, or the
        job's own `failed` event when it came first (a rank whose collective raised when its
        peer died goes on in the interpreter's teardown for a while)."""
        ends = dict(self.ends[index])
        later = self.starts[index + 1] if index + 1 < len(self.starts) else {}
        first = min(later.values(), default=math.inf)
        for event in of(found, "failed"):
            rank = event["rank"]
            if rank in ends and self.starts[index][rank] < event["time"] < first:
                ends[rank] = min(ends[rank], event["time"])
        return ends

    def pid(self, rank: int) -> int:
        """The live process of `rank` in the newest incarnation."""
        newest = len(self.starts) - 1
        return next(p for p, (i, r) in self._ranks.items() if (i, r) == (newest, rank))

    def _watch(self) -> None:
        while not self._stop.wait(EXIT_POLL_SECONDS):
            with self._lock:
                for pid in list(self._live):
                    if _zombie(pid):  # gone, or a zombie: ended
                        index, rank = self._ranks[pid]
                        self.ends[index][rank] = time.time()
                        self._live.discard(pid)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def productive_seconds(found: list[dict[str, Any]], rank: int, after: int = -1) -> float:
    """Productive seconds of rank `rank` in the incarnation whose events are `found`, in its
    steps after step `after`: each step's time from the step before, less a save between
    (the first step's own time is startup)."""
    steps = {e["step"]: e["time"] for e in of(found, "step", rank=rank)}
    saved = {e["step"]: e["time"] - steps[e["step"]] for e in of(found, "checkpoint_saved",
                                                                  rank=rank)
             if e["step"] in steps}
    return sum(steps[step] - steps[step - 1] - saved.get(step - 1, 0.0)
               for step in sorted(steps) if step > after and step - 1 in steps)


def discarded_by_restart(found: list[dict[str, Any]], rank: int, resumed_from: int) -> float:
    """What a restart threw away of rank `rank`'s incarnation `found`: its productive time
    after the checkpoint the next incarnation resumed from."""
    return productive_seconds(found, rank, after=resumed_from)
