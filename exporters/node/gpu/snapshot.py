"""Immutable data that one collection cycle produces and every scrape reads.

The collection thread builds a new `Snapshot` and publishes it with one attribute assignment;
a scrape reads whatever is published and never touches NVML, so a hung NVML call can delay
fresh data but never a scrape.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    """One value of one metric for one GPU; `labels` are the extra labels beyond gpu/uuid/name."""

    metric: str
    value: float
    labels: Labels = ()


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str

    def labels(self) -> tuple[str, str, str]:
        return (str(self.index), self.uuid, self.name)


@dataclass(frozen=True)
class GpuSnapshot:
    """What one cycle learned about one GPU. `up` false means only the health series is served."""

    identity: GpuIdentity
    up: bool
    samples: tuple[Sample, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    taken_at: float  # wall clock, seconds since the epoch, when the cycle finished
    taken_monotonic: float
    duration: float
    nvml_up: bool
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: tuple[GpuSnapshot, ...] = ()
    last_success: float | None = None
    gpm_duration: float | None = None  # seconds spent in GPM calls; None: GPM reading is off


class Tally:
    """A thread-safe counter map whose readers get a sorted copy (no 'changed during iteration')."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[Hashable] = Counter()

    def inc(self, key: Hashable, amount: int = 1) -> None:
        with self._lock:
            self._counts[key] += amount

    def items(self) -> tuple[tuple[Hashable, int], ...]:
        with self._lock:
            return tuple(sorted(self._counts.items(), key=lambda kv: repr(kv[0])))

