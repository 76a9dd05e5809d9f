"""Classify log text into failure events, counting each failure once.

Input is text made of whole lines from one source (a followed file or the kernel log).
The fast path runs one prefilter regex over the whole chunk and jumps straight to the next
line that could match, so ordinary step lines cost a few nanoseconds each. Only candidate
lines, and the lines of a failure that is still being printed, are looked at one by one.

"Counted once" means once per *event*: a log record together with the traceback and
multi-line exception message that follow it (Python's logging prints `logger.exception`
that way, and an uncaught exception prints its traceback the same way). Within an event each
class counts at most once. Source lines shown in a traceback (the line after `  File "...`)
are never classified, so an OOM mentioned in a docstring or a comment there counts nothing.
ECS JSON lines are self-contained events: `message`, `error.type`, `error.message` and the
exception lines of `error.stack_trace` are classified, labels come from `labels.*`.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from exporters.catalog import LOG_EVENT_KINDS
from exporters.logs.identity import JOB_NAME_PATTERN
from exporters.logs.patterns import (
    CHAIN_MARKERS,
    PREFILTER,
    RANK_PREFIX,
    RECORD_START,
    TRACEBACK_HEADER,
    XID,
    classify_text,
)

try:
    import orjson as _orjson

    _loads: Any = _orjson.loads
    _JSON_ERRORS: tuple[type[Exception], ...] = (_orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads
    _JSON_ERRORS = (ValueError,)

# An event still open after this many lines of its source without a continuation is closed,
# so a rank that goes quiet mid-traceback cannot keep the scanner on its slow path.
_MAX_EVENT_IDLE_LINES = 200


@dataclass(frozen=True)
class Source:
    """Where lines come from and the labels they get when the line itself carries none."""

    name: str
    job: str = ""
    rank: str = ""
    kernel: bool = False


@dataclass
class _OpenEvent:
    kinds: set[str] = field(default_factory=set)
    traceback: bool = False
    prev: str = ""
    last_seen: int = 0


def _label_job(value: Any) -> str:
    """A job label from a log line: bounded, label-safe, else 'unknown'."""
    if isinstance(value, str) and JOB_NAME_PATTERN.match(value):
        return value
    return "unknown" if value else ""


def _label_rank(value: Any) -> str:
    text = str(value) if isinstance(value, int | str) and not isinstance(value, bool) else ""
    return text if text.isdigit() and len(text) <= 6 else ""


def _dig(doc: dict[str, Any], dotted: str) -> Any:
    """`doc["a"]["b"]` or `doc["a.b"]`: ECS allows both spellings."""
    if dotted in doc:
        return doc[dotted]
    node: Any = doc
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _is_source_line(prev: str, body: str) -> bool:
    """The line after `  File "x.py", line N, in f` is source code, not a message."""
    return body[:1] in (" ", "\t") and prev.lstrip().startswith('File "')


class Scanner:
    """Counts failure events by (training_job, rank, kind) and Xid events by (xid, pci_bus_id)."""

    def __init__(self) -> None:
        self.lines = 0
        self._events: Counter[tuple[str, str, str]] = Counter()
        self._xids: Counter[tuple[str, str]] = Counter()
        self._open: dict[str, dict[str, _OpenEvent]] = {}
        self._slow_lines = 0
        self._lock = threading.Lock()

    # --- reading results ----------------------------------------------------------------------
    def events(self) -> dict[tuple[str, str, str], int]:
        with self._lock:
            return dict(self._events)

    def xid_events(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._xids)

    def counts_by_kind(self) -> dict[str, int]:
        """Totals per class, every class present (0 when never seen)."""
        totals = dict.fromkeys(LOG_EVENT_KINDS, 0)
        for (_job, _rank, kind), count in self.events().items():
            totals[kind] += count
        return totals

    def register_source(self, source: Source) -> None:
        """Start every class at 0 for a known (job, rank), so alerts see the first increase."""
        if source.kernel or not source.job:
            return
        with self._lock:
            for kind in LOG_EVENT_KINDS:
                self._events.setdefault((source.job, source.rank, kind), 0)

    # --- feeding ------------------------------------------------------------------------------
    def feed(self, source: Source, text: str) -> None:
        """Scan `text` (whole lines) from `source`; state carries over to the next call."""
        if not text:
            return
        self.lines += text.count("\n") + (0 if text.endswith("\n") else 1)
        search = PREFILTER.search
        pos, end_of_text = 0, len(text)
        while pos < end_of_text:
            if not self._open.get(source.name):
                match = search(text, pos)
                if match is None:
                    return
                pos = text.rfind("\n", pos, match.start()) + 1
            end = text.find("\n", pos)
            if end < 0:
                end = end_of_text
            self._line(source, text, pos, end)
            pos = end + 1

    def _line(self, source: Source, text: str, start: int, end: int) -> None:
        line = text[start:end].rstrip("\r")
        body, rank = line, ""
        if line.startswith("["):
            prefix = RANK_PREFIX.match(line)
            if prefix:
                rank, body = prefix.group(1), line[prefix.end():]
        self._slow_lines += 1
        events = self._open.setdefault(source.name, {})
        event = events.get(rank)
        if event is not None:
            if self._continues(event, body):
                event.last_seen = self._slow_lines
            else:
                del events[rank]
                event = None
        self._expire(events)
        if PREFILTER.search(body):
            if body.startswith("{") and self._json_line(source, body):
                event = None
                events.pop(rank, None)
            else:
                prev = event.prev if event is not None else self._previous_line(text, start)
                if not _is_source_line(prev, body):
                    event = self._classify(source, events, event, rank, body, prev)
        if event is not None:
            event.prev = body

    def _previous_line(self, text: str, start: int) -> str:
        if start == 0:
            return ""
        begin = text.rfind("\n", 0, start - 1) + 1
        line = text[begin:start - 1]
        prefix = RANK_PREFIX.match(line) if line.startswith("[") else None
        return line[prefix.end():] if prefix else line

    @staticmethod
    def _continues(event: _OpenEvent, body: str) -> bool:
        if not body or body[0] in " \t":
            return True
        if body.startswith(TRACEBACK_HEADER):
            event.traceback = True
            return True
        if body.startswith(CHAIN_MARKERS):
            return True
        after_frames = event.traceback or event.prev[:1] in (" ", "\t")
        return after_frames and RECORD_START.match(body) is None

    def _expire(self, events: dict[str, _OpenEvent]) -> None:
        if len(events) > 1 or (events and self._slow_lines % 64 == 0):
            for key in [k for k, e in events.items()
                        if self._slow_lines - e.last_seen > _MAX_EVENT_IDLE_LINES]:
                del events[key]

    def _classify(self, source: Source, events: dict[str, _OpenEvent],
                  event: _OpenEvent | None, rank: str, body: str, prev: str) -> _OpenEvent | None:
        kinds = classify_text(body)
        xid = XID.search(body)
        if xid:
            kinds.append("xid")
        if not kinds:
            return event
        if event is None:
            in_traceback = prev[:1] in (" ", "\t") or prev.startswith(TRACEBACK_HEADER)
            event = _OpenEvent(traceback=in_traceback, last_seen=self._slow_lines)
            events[rank] = event
        new = [kind for kind in kinds if kind not in event.kinds]
        event.kinds.update(new)
        job = "" if source.kernel else source.job
        label_rank = "" if source.kernel else (rank or source.rank)
        self._count(job, label_rank, new, xid.group(2) if xid and "xid" in new else None,
                    xid.group(1) if xid else "")
        return event

    def _json_line(self, source: Source, body: str) -> bool:
        """Classify one ECS JSON line; False if it is not a JSON object after all."""
        try:
            doc = _loads(body)
        except _JSON_ERRORS:
            return False
        if not isinstance(doc, dict):
            return False
        parts = [str(doc.get("message", ""))]
        error_type, error_message = _dig(doc, "error.type"), _dig(doc, "error.message")
        if error_type or error_message:
            parts.append(f"{error_type or ''}: {error_message or ''}")
        stack = _dig(doc, "error.stack_trace")
        if isinstance(stack, str):
            # Exception lines only: frames and the source lines under them are indented.
            parts.extend(ln for ln in stack.splitlines() if ln[:1] not in (" ", "\t"))
        text = "\n".join(parts)
        kinds = classify_text(text)
        xid = XID.search(text)
        if xid:
            kinds.append("xid")
        if kinds:
            job = _label_job(_dig(doc, "labels.training_job")) or source.job
            rank = _label_rank(_dig(doc, "labels.rank")) or source.rank
            self._count(job, rank, kinds, xid.group(2) if xid else None,
                        xid.group(1) if xid else "")
        return True

    def _count(self, job: str, rank: str, kinds: list[str], xid: str | None, pci: str) -> None:
        with self._lock:
            for kind in kinds:
                self._events[(job, rank, kind)] += 1
            if xid is not None:
                self._xids[(xid, pci.lower())] += 1
