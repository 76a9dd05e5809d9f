"""What a rank's two threads share: the training thread counts, the shipper thread reads.

`TrainingMonitor` (training thread) and its `Shipper` (background thread) see each other
only through these objects, never through each other's attributes, so what crosses the
thread boundary is written down here. Every field has one writing thread (said beside it):
a plain `+=` on a field only one thread writes needs no lock under the GIL, and a reader
that sees a value one step old is fine (the next datagram carries the newer total).

`RankCounters` holds the cumulative numbers the datagram carries; each is a row of the
metric table with a `wire` name (exporters/contract/catalog.py RANK_WIRE), which is also the
field's name here, so the node side decodes, keeps and serves it from the row alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainwatch.exporters.contract import catalog
from trainwatch.exporters.rank.collectives import CollectiveWatch
from trainwatch.exporters.rank.goodput import RankAccount


# slots: report() updates these on the training thread every step; a slot is the cheapest
# attribute there is (the layout change had made report() 6 % slower, benchmarks/compare_trees.py)
@dataclass(slots=True)
class RankCounters:
    """Cumulative counts of one rank process (tests/training/test_counters.py checks that the
    fields are exactly the catalog's RANK_WIRE names, the two per-thread parts of `nonfinite`
    and the commands applied by type)."""

    samples_total: float = 0.0  # training thread (report)
    tokens_total: float = 0.0  # training thread (report)
    flops_total: float = 0.0  # training thread (report, after set_model_flops)
    peak_flops: float = 0.0  # training thread (set_model_flops); a gauge, 0: unknown
    rollbacks: int = 0  # training thread (a rollback command)
    checkpoint_failures: int = 0  # the checkpoint manager's committer (a failed save)
    dropped: int = 0  # shipper: reports never delivered (buffer overflow, failed send)
    applied_counts: dict[str, int] = field(default_factory=dict)  # training thread, by type
    # Non-finite losses in two parts, one per writer: floats the training thread recognised
    # at once, tensors and numpy scalars only the shipper can convert.
    nonfinite_reported: int = 0  # training thread
    nonfinite_late: int = 0  # shipper

    @property
    def nonfinite(self) -> int:
        """Every non-finite loss reported so far, whichever thread recognised it."""
        return self.nonfinite_reported + self.nonfinite_late

    def wire(self) -> dict[str, float]:
        """The datagram's fields, from the catalog rows (JSON integers where a row says so)."""
        return {row.wire: row.wire_type(getattr(self, row.wire)) for row in catalog.RANK_WIRE}


@dataclass(slots=True)
class RankShared:
    """Everything else the shipper reads of the monitor, or fills in for it.

    The monitor builds one and hands it to its Shipper; the shipper holds no reference to the
    monitor. `buffer` is the hot path's only structure: `report` appends one tuple per step
    (seq, step, perf_counter time, duration, loss, lr, grad_norm, data_wait).
    """

    buffer: deque[tuple[Any, ...]]
    counters: RankCounters
    incarnation: str
    collectives: CollectiveWatch  # which collective the rank is in; its own compute time
    goodput: RankAccount  # this process's seconds by kind (the shipper counts them)
    wall_offset: float  # time.time() - time.perf_counter() at start: report times to wall
    # Callables the shipper asks once per datagram or poll (the monitor owns the state):
    # the command types registered by the script, with their argument schemas, and every
    # type the rank accepts (built-ins too); this process's CUDA memory, None without CUDA.
    command_types: Callable[[], dict[str, dict[str, Any]]]
    schemas: Callable[[], dict[str, dict[str, Any]]]
    cuda_memory: Callable[[], list[float] | None]
    # Applied-command outcomes, (monotonic time, event), newest last (training thread).
    applied_events: deque[tuple[float, dict[str, Any]]] = field(
        default_factory=lambda: deque(maxlen=200))
    last_report: float | None = None  # training thread: perf_counter of the newest report
    # Set once by close() (training thread), read by the shipper's last datagram.
    finished: bool = False  # a clean end
    exiting: bool = False  # an end on an error (a peer's death, an exception)
    # Filled by the shipper, read by the monitor for the checkpoint health flag and the
    # rollback's skip: report seq numbers whose loss was non-finite, and how many so far.
    nonfinite_seqs: deque[int] = field(default_factory=lambda: deque(maxlen=1024))
    nonfinite_seen: int = 0
