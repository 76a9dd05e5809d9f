"""Is this rank inside a collective, and since when? Read on the shipper thread.

Two sources, best first:

- PyTorch's flight recorder (`torch._C._distributed_c10d._dump_fr_trace_json`), which logs
  every collective of every process group, NCCL and (since 2.7) gloo alike: per entry the
  group, its `collective_seq_id`, `time_created_ns` and `retired` (finished). It is on by
  default in torch 2.13 (`TORCH_FR_BUFFER_SIZE`, older name `TORCH_NCCL_TRACE_BUFFER_SIZE`,
  default 2000 entries; 0 turns it off). A dump of a full buffer costs about 1 ms plus JSON
  parsing, so it is read only while the rank has not reported a step for `idle_seconds`: a
  healthy job never pays for it, a stuck one is described within a heartbeat or two.
- The client's own agreement collective (trainwatch.exporters.rank.sync.Agreement), always: its
  sequence number and entry time.

What this covers (docs/training.md "Hangs"): with the flight recorder, every c10d collective
(DDP's gradient all-reduce, FSDP's all-gathers, the client's agreement); without it, only the
agreement - a rank stuck before DDP's all-reduce then looks like its peers.

Dump on stall: with TRAINWATCH_DIAGNOSTICS_DIR set, a rank idle for `dump_after` seconds
writes its flight recorder trace to `<dir>/<job>/rank<N>.json` (atomically, at most every
`dump_after` seconds while idle), where the stalled-job diagnostics
(trainwatch.exporters.node.tools.stack_dump) read it. The dump happens in-process, on this thread,
because
nothing outside the process can read the recorder, and the main thread is blocked in C++ when
it matters (a Python signal handler would never run).
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import time
import zlib
from collections import deque
from pathlib import Path
from typing import Any

from trainwatch.exporters.contract.atomic_file import atomic_write

log = logging.getLogger(__name__)
DEFAULT_GROUP = "0"  # the flight recorder's name of the default process group


def _flight_recorder() -> Any:
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json
    except (ImportError, AttributeError):
        return None
    return _dump_fr_trace_json


def collective_key(group: str, seq: object, op: str) -> int:
    """A number that names one collective: the same on every rank that is inside it (same
    group, sequence number on that group and operation), different for a rank inside another
    one (another group, or another operation at the same place of the same group: a rank that
    took a different branch). 0 is "inside none". CRC-32, so it is exact as a float sample."""
    return zlib.crc32(f"{group}|{seq}|{op}".encode()) or 1


def summarise(entries: list[dict[str, Any]]) -> tuple[int | None, float | None, int]:
    """(newest collective_seq_id on the default group, entry time of the oldest unfinished
    collective in seconds or None, the key of that collective or 0) from flight recorder
    entries. The unfinished collective is looked for on every process group: a rank whose
    peers wait on another group than the default one (a checkpoint's, a pipeline stage's) is
    told apart by it, where the default group's sequence numbers are all equal."""
    seq = None
    since = None
    key = 0
    for entry in entries:
        group = entry.get("process_group") or ["", ""]
        if str(group[0]) == DEFAULT_GROUP and not entry.get("is_p2p"):
            value = entry.get("collective_seq_id")
            if isinstance(value, int) and (seq is None or value > seq):
                seq = value
        if not entry.get("retired", True):
            created = entry.get("time_created_ns")
            if isinstance(created, int) and created > 0 and (since is None
                                                             or created / 1e9 < since):
                since = created / 1e9
                number = entry.get("p2p_seq_id") if entry.get("is_p2p") else \
                    entry.get("collective_seq_id")
                key = collective_key(str(group[0]), number, str(entry.get("profiling_name")))
    return seq, since, key


class CollectiveWatch:
    """What the shipper puts in a datagram's `collective` field (and the stall dump)."""

    def __init__(self, agreement: Any, job: str = "", rank: int = 0,
                 dump_dir: str | None = None, idle_seconds: float = 1.0,
                 dump_after: float = 5.0) -> None:
        self._agreement = agreement
        self._idle = idle_seconds
        self._dump = _flight_recorder() if agreement.world > 1 else None
        self._dump_path = Path(dump_dir, job, f"rank{rank}.json") if dump_dir else None
        self._dump_after = dump_after
        self._read_at = 0.0
        self._written_at = 0.0
        self._cached: list[Any] | None = None
        self.key = 0  # collective_key of what current() last described
        self.compute = OwnCompute(self._dump)
        self._cached_key = 0

    def current(self, last_report: float | None) -> list[Any]:
        """[seq, since, source]; `last_report` is the rank's last report (perf_counter).
        `key` is then the collective_key of the collective the rank is inside (0: none)."""
        now = time.perf_counter()
        idle = now - last_report if last_report is not None else now
        if idle >= self._idle and self._dump is not None:
            if self._cached is not None and now - self._read_at < self._idle:
                self.key = self._cached_key
                return self._cached
            try:
                raw = self._dump(includeCollectives=True, onlyActive=False)
                seq, since, key = summarise(json.loads(raw).get("entries") or [])
            except Exception as exc:  # a recorder that is off or broken: use our own
                log.debug("flight recorder unreadable: %s", exc)
                self._dump = None
            else:
                self._read_at = now
                if idle >= self._dump_after and now - self._written_at >= self._dump_after:
                    self._write(raw)
                    self._written_at = now
                self._cached_key = key
                if seq is not None:
                    self._cached = [seq, since, "flight_recorder"]
                    self.key = key
                    return self._cached
                self._cached = None
                self.key = key or self._agreement_key()
                return [self._agreement.seq, self._agreement.since, "agreement"]
        self._cached = None
        self.key = self._agreement_key()
        return [self._agreement.seq, self._agreement.since, "agreement"]

    def _agreement_key(self) -> int:
        if self._agreement.since is None:
            return 0
        return collective_key("agreement", self._agreement.seq, "agreement")

    def _write(self, raw: bytes | str) -> None:
        if self._dump_path is None:
            return
        data = raw.encode() if isinstance(raw, str) else raw
        try:
            self._dump_path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            atomic_write(self._dump_path, lambda handle: handle.write(data))
            os.chmod(self._dump_path, 0o640)
        except OSError as exc:
            log.warning("cannot write the flight recorder dump %s: %s", self._dump_path,
                        exc.strerror)
            self._dump_path = None


class OwnCompute:
    """Each step's own compute time: from the end of the previous step (its report) to the
    rank's entry into the step's last collective, from the entry times PyTorch's flight
    recorder logs for every collective (`time_created_ns`, any group). In synchronous
    training every rank leaves a collective together, so step times are equal and hide a
    slow rank; the time before entering is the rank's own work, the rest is waiting for the
    slowest (NVIDIA's straggler detection scores ranks on their own compute for the same
    reason). A step without a collective in it is not measured.

    The recorder is read on the shipper thread, not per step, every `every` seconds or more
    rarely: a dump of a full buffer (2,000 entries) and its parse took 90-200 ms on this
    loaded 2-core machine, time the training thread may lose to the GIL, so the period
    stretches to 1,000 x the last read's cost (0.1 % of the time), up to MAX_EVERY. For gloo
    the entry time is the call; for NCCL it is when the CPU enqueued the collective
    (docs/training.md, "Stragglers"). Without the recorder nothing is measured and the
    series stay absent.
    """

    MAX_EVERY = 60.0

    def __init__(self, dump: Any, every: float = 10.0) -> None:
        self._dump = dump
        self._base_every = self._every = every
        self._read_at = time.monotonic()
        self._reports: deque[float] = deque(maxlen=8192)  # report wall times, not yet used
        self._previous: float | None = None
        self.seconds = 0.0  # cumulative own compute time of the measured steps
        self.steps = 0

    def note_report(self, wall: float) -> None:
        if self._dump is not None:
            self._reports.append(wall)

    def measure(self, force: bool = False) -> None:
        """Attribute the reports seen since the last read to compute and waiting."""
        now = time.monotonic()
        if self._dump is None or not self._reports or (
                not force and now - self._read_at < self._every):
            return
        self._read_at = now
        started = time.perf_counter()
        try:
            raw = self._dump(includeCollectives=True, onlyActive=False)
            entries = json.loads(raw).get("entries") or []
        except Exception as exc:  # off or broken: stop measuring
            log.debug("flight recorder unreadable: %s", exc)
            self._dump = None
            return
        cost = time.perf_counter() - started
        self._every = min(self.MAX_EVERY, max(self._base_every, 1000 * cost))
        entered = sorted(e["time_created_ns"] / 1e9 for e in entries
                         if isinstance(e.get("time_created_ns"), int))
        for report in sorted(self._reports):
            previous, self._previous = self._previous, report
            if previous is None:
                continue
            last = bisect.bisect_right(entered, report) - 1
            if last >= 0 and entered[last] > previous:
                self.seconds += entered[last] - previous
                self.steps += 1
        self._reports.clear()
