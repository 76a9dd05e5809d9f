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
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from trainwatch.exporters.contract.catalog import LOG_EVENT_KINDS
from trainwatch.exporters.contract.identity import is_job_name
from trainwatch.exporters.node.logs.patterns import (
    CHAIN_MARKERS,
    PREFILTER,
    PREFILTER_INF,
    PREFILTER_TOKENS,
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

# How far back (characters) the lines between two matches of one event may reach; a failure
# printed further apart than this is counted as a new event.
_MAX_GAP = 64 * 1024


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
    end: int = 0  # where the event's last line ends, as an index into the source's window


@dataclass
class _SourceState:
    tail: str = ""  # the last lines seen, so an event can continue into the next chunk
    events: dict[str, _OpenEvent] = field(default_factory=dict)


def _split_rank(line: str) -> tuple[str, str]:
    """("1", rest) for a torchrun "[rank1]:" line, ("", line) otherwise."""
    if line.startswith("["):
        prefix = RANK_PREFIX.match(line)
        if prefix:
            return prefix.group(1), line[prefix.end():]
    return "", line


def _label_job(value: Any) -> str:
    """A job label from a log line: bounded, label-safe, else 'unknown'."""
    if is_job_name(value):
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
        self._sources: dict[str, _SourceState] = {}
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
        """Scan `text` (whole lines) from `source`; open events carry over to the next call."""
        if not text:
            return
        if not text.endswith("\n"):
            text += "\n"
        self.lines += text.count("\n")
        state = self._sources.get(source.name)
        if state is None:
            state = self._sources[source.name] = _SourceState()
        window = state.tail + text
        base = len(state.tail)
        for start in self._candidate_lines(window, base):
            end = window.find("\n", start)
            self._hit(source, state, window, start, end)
        cut = max(0, len(window) - _MAX_GAP)
        state.tail = window[cut:]
        for key in [k for k, e in state.events.items() if e.end - cut < 0]:
            del state.events[key]
        for event in state.events.values():
            event.end -= cut

    @staticmethod
    def _candidate_lines(window: str, base: int) -> list[int]:
        """Start offsets (>= base) of the lines the prefilter flags, in order."""
        starts: set[int] = set()
        if window.isascii():
            lower = window.lower()
            find, rfind = lower.find, lower.rfind
            for token in PREFILTER_TOKENS:
                index = find(token, base)
                while index >= 0:
                    starts.add(rfind("\n", 0, index) + 1)
                    index = find(token, find("\n", index) + 1 or len(lower))
            for match in PREFILTER_INF.finditer(lower, base):
                starts.add(rfind("\n", 0, match.start()) + 1)
        else:
            for match in PREFILTER.finditer(window, base):
                starts.add(window.rfind("\n", 0, match.start()) + 1)
        return sorted(start for start in starts if start >= base)

    def _hit(self, source: Source, state: _SourceState, window: str, start: int,
             end: int) -> None:
        """A line the prefilter flagged: classify it and decide which event it belongs to."""
        rank, body = _split_rank(window[start:end].rstrip("\r"))
        if body.startswith("{") and self._json_line(source, body):
            state.events.pop(rank, None)
            return
        prev = self._previous_line(window, start, rank)
        if _is_source_line(prev, body):
            return
        kinds = classify_text(body)
        xid = XID.search(body)
        if xid:
            kinds.append("xid")
        if not kinds:
            return
        event = state.events.get(rank)
        if event is not None and not self._continues_to(event, window, start, rank, body):
            event = None
        if event is None:
            in_traceback = prev[:1] in (" ", "\t") or prev.startswith(TRACEBACK_HEADER)
            event = state.events[rank] = _OpenEvent(traceback=in_traceback)
        event.end, event.prev = end + 1, body
        new = [kind for kind in kinds if kind not in event.kinds]
        event.kinds.update(new)
        job = "" if source.kernel else source.job
        label_rank = "" if source.kernel else (rank or source.rank)
        self._count(job, label_rank, new, xid.group(2) if xid and "xid" in new else None,
                    xid.group(1) if xid else "")

    @staticmethod
    def _previous_line(window: str, start: int, rank: str, look_back: int = 32) -> str:
        """The previous line of the same rank stream (torchrun interleaves ranks)."""
        end = start - 1
        for _ in range(look_back):
            if end < 0:
                return ""
            begin = window.rfind("\n", 0, end) + 1
            line_rank, body = _split_rank(window[begin:end])
            if line_rank == rank:
                return body
            end = begin - 1
        return ""

    def _continues_to(self, event: _OpenEvent, window: str, start: int, rank: str,
                      body: str) -> bool:
        """Do all lines of this rank since the event's last line, and `body`, continue it?"""
        if event.end < 0 or start - event.end > _MAX_GAP:
            return False
        for line_body in self._lines_of_rank(window[event.end:start], rank):
            if not self._continues(event, line_body):
                return False
            event.prev = line_body
        return self._continues(event, body)

    @staticmethod
    def _lines_of_rank(gap: str, rank: str) -> Iterator[str]:
        """The lines of one rank stream in `gap`, prefix removed (found with str.find)."""
        if rank:
            tag = f"[rank{rank}]:"
            index = gap.find(tag)
            while index >= 0:
                if index == 0 or gap[index - 1] == "\n":
                    end = gap.find("\n", index)
                    yield _split_rank(gap[index:end].rstrip("\r"))[1]
                index = gap.find(tag, index + 1)
            return
        for line in gap.split("\n")[:-1]:
            line_rank, line_body = _split_rank(line.rstrip("\r"))
            if not line_rank:
                yield line_body

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
