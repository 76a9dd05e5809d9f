"""Turn captured LogRecords into ECS JSON lines.

Who runs it: the caller that fills a batch (while its records are still in that CPU's cache),
or the writer thread for what it takes itself (on its timer, flush and close).

The layout follows Elastic's ECS logging spec (`spec/spec.json` of elastic/ecs-logging, vendored
in tests/logs/data/): `@timestamp`, `log.level` and `message` come first and in that order,
`log.level` and `ecs.version` are dotted top-level keys, `ecs.version` is the version the
official ecs-logging libraries write, and `event.dataset` defaults to the service name (what
Kibana's log views and log anomaly detection group by). Everything else is a nested object
(`log.logger` is `{"log": {"logger": ...}}`), which Filebeat's `expand_keys` and Elasticsearch
read as the same fields. `extra=` fields are kept at the top level under their names.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import socket
import time
from collections.abc import Callable
from itertools import chain
from math import floor
from typing import Any, NoReturn

# The spec (spec.json: "ecs": {"version": "1.x"}) pins the major version; ecs-logging-python
# writes 1.6.0, and every field written here exists in ECS 1.6.
ECS_VERSION = "1.6.0"

try:  # optional: several times faster than the stdlib encoder
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName", "_tw_error"}
_BASE_RECORD_KEYS = len(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)))

_DICT = operator.attrgetter("__dict__")


class _NotPlain(Exception):
    """A batch holds a record the fast path cannot write (extras, an error, a stack, an odd msg)."""


def _not_plain() -> NoReturn:
    """Raised from inside the render comprehension for a record the fast path cannot write:
    cheaper than marking it and scanning the batch for the mark afterwards (a `None in list`
    scan compares every message with None through the rich-compare fallback)."""
    raise _NotPlain


def _default(value: Any) -> str:
    """Anything the encoder cannot represent is written as its str(), never an error."""
    return str(value)


def make_encoder(prefer_orjson: bool = True) -> Callable[[Any], bytes]:
    """An object-to-bytes JSON encoder: orjson when installed, else the stdlib."""
    if prefer_orjson and _orjson is not None:
        dumps = _orjson.dumps
        opts = _orjson.OPT_NON_STR_KEYS

        def encode(obj: Any) -> bytes:
            return dumps(obj, default=_default, option=opts)

        return encode
    stdlib = json.JSONEncoder(default=_default, separators=(",", ":"), ensure_ascii=False)

    def encode_stdlib(obj: Any) -> bytes:
        return stdlib.encode(obj).encode("utf-8", "replace")

    return encode_stdlib


def utc_timestamp(created: float) -> str:
    """ISO-8601 UTC with milliseconds, the form ecs-logging writes (`2026-11-21T10:30:25.120Z`)."""
    second = int(created)
    return _utc_millis(second, int((created - second) * 1000))


def _utc_millis(second: int, millis: int) -> str:
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(second))}.{millis:03d}Z"


def _file_name(pathname: str) -> str:
    """`log.origin.file.name`: the base name of the record's `pathname`, exactly what
    LogRecord puts in `filename`. Derived here rather than read from `filename` so that the
    fast path can key its call-site cache by `pathname` (see `EcsFormatter._fast_block`); a
    record whose `filename` was rewritten without its `pathname` is written by `pathname`."""
    return os.path.basename(pathname)


def _stamp(ms: int) -> bytes:
    """The start of a fast-path line for a record logged in millisecond `ms` (since 1970)."""
    return b'{"@timestamp":"' + _utc_millis(*divmod(ms, 1000)).encode()


def render_message(record: logging.LogRecord) -> str:
    """record.getMessage(), but a bad format string becomes text instead of an error."""
    try:
        return record.getMessage()
    except Exception as exc:
        return f"{record.msg!r} (message formatting failed: {exc!r}; args={record.args!r})"


class EcsFormatter:
    """Builds ECS lines for batches of records (callers and the writer may share one: its
    caches are dicts, each of whose single operations is atomic under the GIL).

    Where the time goes (measured, see docs/performance.md): per record, rendering `msg % args`,
    escaping the message, the timestamp and the fields that depend on the call site. So the
    batch path renders every message first and escapes them all with one encoder call, turns
    each millisecond into text once, and encodes the call-site fields (level, logger, file,
    line, function, process, thread) once per distinct site; a line is then the join of four
    cached or shared byte strings (see `_fast_block`). Records with `extra=` fields, an error
    or a stack go through a dict and the general encoder.
    """

    def __init__(self, service: str, job: str, rank: int, host: str | None = None,
                 dataset: str | None = None, prefer_orjson: bool = True) -> None:
        self.service = {"name": service}
        self.event = {"dataset": dataset or service}
        self.host = {"name": host or socket.gethostname()}
        self.job = job
        self.rank = str(rank)
        self._encode = make_encoder(prefer_orjson)
        self._batch_strings = _orjson is not None and prefer_orjson
        self._sites: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}
        self._stamps: dict[int, bytes] = {}
        constant = self._encode({"ecs.version": ECS_VERSION, "event": self.event})
        self._after_message = b'",' + constant[1:-1] + b","
        self._tail = self._encode({"service": self.service, "host": self.host,
                                   "labels": {"training_job": job, "rank": self.rank}})[1:]

    # --- fast path ------------------------------------------------------------------------------
    def _new_stamp(self, ms: int) -> bytes:
        if len(self._stamps) > 4096:  # bounded: timestamps only grow
            self._stamps.clear()
        stamp = self._stamps[ms] = _stamp(ms)
        return stamp

    def _new_site(self, key: tuple[Any, ...]) -> tuple[bytes, bytes]:
        if len(self._sites) > 10_000:  # bounded: call sites repeat, but never trust that
            self._sites.clear()
        site = self._sites[key] = self._site(key)
        return site

    def _site(self, key: tuple[Any, ...]) -> tuple[bytes, bytes]:
        """The parts of a line that are the same for every call from one place: before the
        message, and after it up to and including the newline.

        `key` is exactly the record fields these parts are made of (see `_fast_block`); the
        file name is the base name of `pathname`, as LogRecord derives it (`_file_name`)."""
        levelname, name, pathname, lineno, func, process, thread = key
        fields = self._encode({
            "log": {"logger": name,
                    "origin": {"file": {"name": _file_name(pathname), "line": lineno},
                               "function": func}},
            "process": {"pid": process, "thread": {"name": thread}},
        })
        return (b'","log.level":' + self._encode(levelname.lower()) + b',"message":"',
                self._after_message + fields[1:-1] + b"," + self._tail + b"\n")

    def block(self, batch: list[logging.LogRecord]) -> bytes:
        """The batch as newline-terminated ECS JSON lines in one buffer."""
        if not batch:
            return b""
        if self._batch_strings:
            try:
                return self._fast_block(batch)
            except _NotPlain:
                pass
        return b"".join([self._any_line(record) for record in batch])

    def _fast_block(self, batch: list[logging.LogRecord]) -> bytes:
        """`block` for a batch of plain records: no extras, no error or stack, a str msg.

        Why list comprehensions over the records instead of map() over attrgetters: a
        comprehension reads attributes through CPython's specialised instance-attribute load
        (a few ns each), attrgetter through the generic lookup, and one pass per field would
        also meet every record cold again. Each record gives four byte strings, joined once
        for the whole batch (no per-line buffer): the timestamp (cached per millisecond), the
        call-site part before the message (level), the message and the call-site part after
        it (logger, origin, process, constants, newline), cached by exactly the fields it is
        made of. The key holds `pathname`, not `filename`: LogRecord makes a fresh `filename`
        string per record (hashed and compared per lookup), while `pathname` is the code
        object's own string, hashed once and compared by identity (~6 % of the handler's
        own cost; the file name is derived from it, on both paths). The messages are
        rendered in the first comprehension (one tight loop of formatting code) and
        JSON-escaped with one orjson call for the batch; splitting its output at `","` is
        exact because inside an encoded string every `"` is escaped. The millisecond is
        `math.floor(created * 1000.0)`: the same int as `int()` for any time after 1970, but a
        plain C function call, where `int()` goes through the type call (~4 % of the handler's
        cost in the cost model, see docs/performance.md). The extras check reads
        each record's `__dict__`, which makes CPython build a dict for it and de-specialises
        later attribute loads, so it runs after the comprehensions (~3x as costly first).
        """
        sites_get = self._sites.get
        stamps_get = self._stamps.get
        new_site = self._new_site
        new_stamp = self._new_stamp
        try:
            messages = [(r.msg % r.args if r.args else r.msg)
                        if type(r.msg) is str and not r.stack_info else _not_plain() for r in batch]
        except Exception:  # a bad format string: the line reports it (render_message)
            raise _NotPlain from None
        escaped = _orjson.dumps(messages)[2:-2].split(b'","')  # type: ignore[union-attr]
        if len(escaped) != len(batch):
            raise _NotPlain
        parts = [(
            stamps_get(ms := floor(r.created * 1000.0)) or new_stamp(ms),
            (site := sites_get(key := (r.levelname, r.name, r.pathname, r.lineno, r.funcName,
                                       r.process, r.threadName)) or new_site(key))[0],
            message, site[1]) for r, message in zip(batch, escaped, strict=True)]
        if list(map(len, map(_DICT, batch))).count(_BASE_RECORD_KEYS) != len(batch):
            raise _NotPlain  # extras (or our captured error): the general path writes them
        return b"".join(chain.from_iterable(parts))

    def _any_line(self, record: logging.LogRecord) -> bytes:
        """One newline-terminated line for any record: cached parts when plain, else a dict."""
        if (type(record.msg) is not str or record.stack_info
                or len(record.__dict__) != _BASE_RECORD_KEYS or not self._batch_strings):
            return self.line(record) + b"\n"
        key = (record.levelname, record.name, record.pathname, record.lineno, record.funcName,
               record.process, record.threadName)
        site = self._sites.get(key) or self._new_site(key)
        ms = floor(record.created * 1000.0)
        message = self._encode(render_message(record))[1:-1]
        return b"".join((self._stamps.get(ms) or self._new_stamp(ms), site[0], message, site[1]))

    def lines(self, batch: list[logging.LogRecord]) -> list[bytes]:
        """One ECS JSON line (no newline) per record, in order."""
        return self.block(batch)[:-1].split(b"\n") if batch else []

    def line(self, record: logging.LogRecord) -> bytes:
        """One ECS JSON line (no newline) for `record`."""
        return self._encode(self.document(record))

    # --- general path ----------------------------------------------------------------------------
    def document(self, record: logging.LogRecord) -> dict[str, Any]:
        """The ECS fields for one record, in the spec's order; args are rendered here."""
        doc: dict[str, Any] = {
            "@timestamp": utc_timestamp(record.created),
            "log.level": record.levelname.lower(),
            "message": render_message(record),
            "ecs.version": ECS_VERSION,
            "event": self.event,
            "log": {"logger": record.name,
                    "origin": {"file": {"name": _file_name(record.pathname),
                                        "line": record.lineno},
                               "function": record.funcName}},
            "process": {"pid": record.process, "thread": {"name": record.threadName}},
            "service": self.service,
            "host": self.host,
            "labels": {"training_job": self.job, "rank": self.rank},
        }
        error = getattr(record, "_tw_error", None)
        if error is not None:
            doc["error"] = error
        elif record.stack_info:
            doc["error"] = {"stack_trace": record.stack_info}
        for key in record.__dict__.keys() - _STANDARD_ATTRS:
            if key not in doc:
                doc[key] = record.__dict__[key]
        return doc


def capture_error(record: logging.LogRecord, formatter: logging.Formatter) -> None:
    """Render exc_info to text on the caller's thread, before its traceback can change.

    Errors are rare, so paying for this on the caller is cheap in total, and it keeps the
    writer from holding live frames. The result rides on the record as `_tw_error`.
    """
    exc_type, exc_value, _tb = record.exc_info or (None, None, None)
    if exc_type is None:
        return
    stack = formatter.formatException(record.exc_info)  # type: ignore[arg-type]
    if record.stack_info:
        stack = f"{stack}\n{record.stack_info}"
    record._tw_error = {  # type: ignore[attr-defined]
        "type": f"{exc_type.__module__}.{exc_type.__qualname__}"
        if exc_type.__module__ not in ("builtins", "__main__") else exc_type.__qualname__,
        "message": str(exc_value),
        "stack_trace": stack,
    }
    record.exc_info = None
    record.exc_text = None
