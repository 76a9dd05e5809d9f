"""Turn captured LogRecords into ECS JSON lines (runs on the writer thread, never the caller's).

The layout follows Elastic's ECS logging spec (`spec/spec.json` of elastic/ecs-logging, vendored
in tests/logs/data/): `@timestamp`, `log.level` and `message` come first and in that order,
`log.level` and `ecs.version` are dotted top-level keys, `ecs.version` is the version the
official ecs-logging libraries write, and `event.dataset` defaults to the service name (what
Kibana's log views and log anomaly detection group by). Everything else is a nested object
(`log.logger` is `{"log": {"logger": ...}}`), which Filebeat's `expand_keys` and Elasticsearch
read as the same fields. `extra=` fields are kept at the top level under their names.
"""

from __future__ import annotations

import functools
import json
import logging
import operator
import socket
import time
from collections.abc import Callable
from typing import Any

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

# C-level accessors for the batch path (see EcsFormatter.lines).
_MSG = operator.attrgetter("msg")
_ARGS = operator.attrgetter("args")
_CREATED = operator.attrgetter("created")
_DICT = operator.attrgetter("__dict__")
_SITE_KEY = operator.attrgetter("levelno", "name", "pathname", "lineno", "funcName", "process",
                                "threadName")
_TIMES_1000 = functools.partial(operator.mul, 1000)
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
_STR_ONLY = {str}


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


def render_message(record: logging.LogRecord) -> str:
    """record.getMessage(), but a bad format string becomes text instead of an error."""
    try:
        return record.getMessage()
    except Exception as exc:
        return f"{record.msg!r} (message formatting failed: {exc!r}; args={record.args!r})"


class EcsFormatter:
    """Builds ECS lines for batches of records. One instance per writer thread (not thread-safe).

    Where the time goes (measured, see docs/performance.md): per record, rendering `msg % args`,
    escaping the message, the timestamp and the fields that depend on the call site. So the
    batch path renders every message first and escapes them all with one encoder call, turns
    each millisecond into text once, and encodes the call-site fields (level, logger, file,
    line, function, process, thread) once per distinct site; a line is then the join of four
    cached or shared byte strings. Records with `extra=` fields or an error go through a dict
    and the general encoder.
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
    def _stamp(self, ms: int) -> bytes:
        if len(self._stamps) > 4096:
            self._stamps.clear()
        stamp = self._stamps[ms] = b'{"@timestamp":"' + _utc_millis(*divmod(ms, 1000)).encode()
        return stamp

    def _site(self, key: tuple[Any, ...], record: logging.LogRecord) -> tuple[bytes, bytes]:
        """The parts of a line that are the same for every call from one place."""
        if len(self._sites) > 10_000:  # bounded: call sites repeat, but never trust that
            self._sites.clear()
        fields = self._encode({
            "log": {"logger": record.name,
                    "origin": {"file": {"name": record.filename, "line": record.lineno},
                               "function": record.funcName}},
            "process": {"pid": record.process, "thread": {"name": record.threadName}},
        })
        site = self._sites[key] = (
            b'","log.level":' + self._encode(record.levelname.lower()) + b',"message":"',
            self._after_message + fields[1:-1] + b"," + self._tail)
        return site

    def _escaped_messages(self, batch: list[logging.LogRecord]) -> list[bytes] | None:
        """Every message of the batch JSON-escaped (without quotes), or None to go one by one.

        One orjson call encodes the whole list; splitting its output at `","` is exact because
        inside an encoded string every `"` is escaped.
        """
        if not self._batch_strings:
            return None
        raw = list(map(_MSG, batch))
        if set(map(type, raw)) != _STR_ONLY:
            return None
        args = list(map(_ARGS, batch))
        try:
            if all(args):  # the common case, rendered by C loops alone
                messages = list(map(operator.mod, raw, args))
            else:  # getMessage() applies % only when there are args
                messages = [m % a if a else m for m, a in zip(raw, args, strict=True)]
        except Exception:  # a bad format string: the one-by-one path reports it in the line
            return None
        escaped = _orjson.dumps(messages)[2:-2].split(b'","')  # type: ignore[union-attr]
        return escaped if len(escaped) == len(batch) else None

    def lines(self, batch: list[logging.LogRecord]) -> list[bytes]:
        """One ECS JSON line (no newline) per record, in order."""
        return self.block(batch)[:-1].split(b"\n") if batch else []

    def block(self, batch: list[logging.LogRecord]) -> bytes:
        """The batch as newline-terminated ECS JSON lines in one buffer.

        Written as map() over C callables (attrgetter, dict.get, bytes.join) rather than a
        Python loop: at a few hundred nanoseconds per record, bytecode dispatch is the cost.
        (One flat join over all parts measured slower than a join per line plus one "\n" join.)
        """
        escaped = self._escaped_messages(batch)
        sizes = list(map(len, map(_DICT, batch)))
        if escaped is None:  # a message that needs one-by-one rendering
            return b"".join([self.line(record) + b"\n" for record in batch])
        if sizes.count(_BASE_RECORD_KEYS) != len(sizes):  # some records have extras or an error
            return b"".join([
                self._fast_line(record, message) if size == _BASE_RECORD_KEYS
                else self.line(record) + b"\n"
                for record, size, message in zip(batch, sizes, escaped, strict=True)])
        keys = list(map(_SITE_KEY, batch))
        sites = list(map(self._sites.get, keys))
        if None in sites:
            known = self._sites
            for index, site in enumerate(sites):
                if site is None:
                    sites[index] = known.get(keys[index]) or self._site(keys[index], batch[index])
        millis = list(map(int, map(_TIMES_1000, map(_CREATED, batch))))
        stamps = list(map(self._stamps.get, millis))
        if None in stamps:
            known_stamps = self._stamps
            for index, stamp in enumerate(stamps):
                if stamp is None:
                    stamps[index] = known_stamps.get(millis[index]) or self._stamp(millis[index])
        lines = list(map(b"".join, zip(stamps, map(_FIRST, sites), escaped, map(_SECOND, sites),
                                       strict=True)))
        lines.append(b"")  # the block ends with a newline without copying it again
        return b"\n".join(lines)

    def _fast_line(self, record: logging.LogRecord, message: bytes) -> bytes:
        """One newline-terminated line from the cached parts (for mixed batches)."""
        key = _SITE_KEY(record)
        site = self._sites.get(key) or self._site(key, record)
        ms = int(record.created * 1000)
        return b"".join((self._stamps.get(ms) or self._stamp(ms), site[0], message, site[1],
                         b"\n"))

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
                    "origin": {"file": {"name": record.filename, "line": record.lineno},
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
