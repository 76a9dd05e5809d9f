"""Is this rank inside a collective, and since when? Read on the shipper thread.

Two sources, best first:

- PyTorch's flight recorder (`torch._C._distributed_c10d._dump_fr_trace_json`), which logs
  every collective of every process group, NCCL and (since 2.7) gloo alike: per entry the
  group, its `collective_seq_id`, `time_created_ns` and `retired` (finished). It is on by
  default in torch 2.13 (`TORCH_FR_BUFFER_SIZE`, older name `TORCH_NCCL_TRACE_BUFFER_SIZE`,
  default 2000 entries; 0 turns it off). A dump of a full buffer costs about 1 ms plus JSON
  parsing, so it is read only while the rank has not reported a step for `idle_seconds`: a
  healthy job never pays for it, a stuck one is described within a heartbeat or two.
- The client's own agreement collective (exporters.training.sync.Agreement), always: its
  sequence number and entry time.

What this covers (docs/training.md "Hangs"): with the flight recorder, every c10d collective
(DDP's gradient all-reduce, FSDP's all-gathers, the client's agreement); without it, only the
agreement - a rank stuck before DDP's all-reduce then looks like its peers.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

log = logging.getLogger(__name__)
DEFAULT_GROUP = "0"  # the flight recorder's name of the default process group


def _flight_recorder() -> Any:
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json
    except (ImportError, AttributeError):
        return None
    return _dump_fr_trace_json


def summarise(entries: list[dict[str, Any]]) -> tuple[int | None, float | None]:
    """(newest collective_seq_id on the default group, entry time of the oldest unfinished
    collective in seconds or None) from flight recorder entries."""
    seq = None
    since = None
    for entry in entries:
        group = entry.get("process_group") or ["", ""]
        if str(group[0]) == DEFAULT_GROUP and not entry.get("is_p2p"):
            value = entry.get("collective_seq_id")
            if isinstance(value, int) and (seq is None or value > seq):
                seq = value
        if not entry.get("retired", True):
            created = entry.get("time_created_ns")
            if isinstance(created, int) and created > 0:
                since = created / 1e9 if since is None else min(since, created / 1e9)
    return seq, since


class CollectiveWatch:
    """What the shipper puts in a datagram's `collective` field."""

    def __init__(self, agreement: Any, idle_seconds: float = 1.0) -> None:
        self._agreement = agreement
        self._idle = idle_seconds
        self._dump = _flight_recorder() if agreement.world > 1 else None

    def current(self, last_report: float | None) -> list[Any]:
        """[seq, since, source]; `last_report` is the rank's last report (perf_counter)."""
        idle = last_report is None or time.perf_counter() - last_report >= self._idle
        if idle and self._dump is not None:
            try:
                document = json.loads(self._dump(includeCollectives=True, onlyActive=False))
                seq, since = summarise(document.get("entries") or [])
                if seq is not None:
                    return [seq, since, "flight_recorder"]
            except Exception as exc:  # a recorder that is off or broken: use our own
                log.debug("flight recorder unreadable: %s", exc)
                self._dump = None
        return [self._agreement.seq, self._agreement.since, "agreement"]
