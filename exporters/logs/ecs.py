"""Turn a captured LogRecord into one ECS JSON line (runs on the writer thread, never the caller's).

Field layout follows the convention of Elastic's ecs-logging libraries: `@timestamp`,
`log.level` and `ecs.version` are dotted top-level keys, the rest are nested objects
(`log.logger` is `{"log": {"logger": ...}}`), which Filebeat's `expand_keys` and Elasticsearch
both read as the same ECS fields. `extra=` fields are kept at the top level under their names.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

ECS_VERSION = "8.11.0"

try:  # optional: several times faster than the stdlib encoder
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName", "_tw_error"}


def _default(value: Any) -> str:
    """Anything the encoder cannot represent is written as its str(), never an error."""
    return str(value)


def make_string_encoder(prefer_orjson: bool = True) -> Callable[[str], bytes]:
    """A JSON string literal (quotes and escapes included) as UTF-8 bytes."""
    if prefer_orjson and _orjson is not None:
        return _orjson.dumps  # type: ignore[no-any-return]
    quote = json.encoder.encode_basestring  # type: ignore[attr-defined]

    def encode(text: str) -> bytes:
        return quote(text).encode("utf-8", "replace")  # type: ignore[no-any-return]

    return encode


def make_encoder(prefer_orjson: bool = True) -> Callable[[dict[str, Any]], bytes]:
    """An object-to-bytes JSON encoder: orjson when installed, else the stdlib."""
    if prefer_orjson and _orjson is not None:
        dumps = _orjson.dumps
        opts = _orjson.OPT_NON_STR_KEYS

        def encode(obj: dict[str, Any]) -> bytes:
            return dumps(obj, default=_default, option=opts)

        return encode
    stdlib = json.JSONEncoder(default=_default, separators=(",", ":"), ensure_ascii=False)

    def encode_stdlib(obj: dict[str, Any]) -> bytes:
        return stdlib.encode(obj).encode("utf-8", "replace")

    return encode_stdlib


class TimestampCache:
    """ISO-8601 UTC timestamps with milliseconds; the per-second prefix is computed once."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""
        self._prefix_bytes = b""

    def _refresh(self, second: int) -> None:
        self._second = second
        self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        self._prefix_bytes = self._prefix.encode()

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._refresh(second)
        return f"{self._prefix}.{int((created - second) * 1000):03d}Z"

    def as_bytes(self, created: float) -> bytes:
        second = int(created)
        if second != self._second:
            self._refresh(second)
        return b"%s.%03dZ" % (self._prefix_bytes, int((created - second) * 1000))


_BASE_RECORD_KEYS = len(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)))


class EcsFormatter:
    """Builds the ECS line for a record. One instance per writer thread (not thread-safe).

    The common record (no `extra=` fields, no exception) takes a fast path: the constant
    parts of the line are encoded once, strings that repeat (logger, file and function
    names) are escaped once and cached, and only the message is JSON-escaped per record.
    Records with extras or errors go through a dict and the general JSON encoder.
    """

    def __init__(self, service: str, job: str, rank: int, host: str | None = None,
                 prefer_orjson: bool = True) -> None:
        self.service = {"name": service}
        self.host = {"name": host or socket.gethostname()}
        self.job = job
        self.rank = str(rank)
        self.timestamp = TimestampCache()
        self._encode = make_encoder(prefer_orjson)
        self._string = make_string_encoder(prefer_orjson)
        self._sites: dict[tuple[Any, ...], bytes] = {}
        self._constant = self._encode({"ecs.version": ECS_VERSION, "service": self.service,
                                       "host": self.host,
                                       "labels": {"training_job": job, "rank": self.rank}})[1:]
        self._last_ms = -1
        self._last_ts = b""

    def _site(self, key: tuple[Any, ...], record: logging.LogRecord) -> bytes:
        """Everything after the message that is the same for every call from one place."""
        if len(self._sites) > 10_000:  # bounded: call sites repeat, but never trust that
            self._sites.clear()
        fields = self._encode({
            "log.level": record.levelname.lower(),
            "log": {"logger": record.name,
                    "origin": {"file": {"name": record.filename, "line": record.lineno},
                               "function": record.funcName}},
            "process": {"pid": record.process, "thread": {"name": record.threadName}},
        })
        site = self._sites[key] = b"," + fields[1:-1] + b"," + self._constant
        return site

    def line(self, record: logging.LogRecord) -> bytes:
        """One ECS JSON line (no newline) for `record`."""
        if len(record.__dict__) != _BASE_RECORD_KEYS:
            return self._encode(self.document(record))
        try:
            message = record.msg
            if type(message) is not str:
                message = str(message)
            if record.args:
                message = message % record.args
        except Exception as exc:  # a bad format string must not kill the writer
            message = f"{record.msg!r} (message formatting failed: {exc!r}; args={record.args!r})"
        created = record.created
        ms = int(created * 1000)
        if ms != self._last_ms:
            self._last_ms = ms
            self._last_ts = self.timestamp(created).encode()
        key = (record.levelno, record.name, record.pathname, record.lineno, record.funcName,
               record.process, record.threadName)
        site = self._sites.get(key) or self._site(key, record)
        return b"".join((b'{"@timestamp":"', self._last_ts, b'","message":',
                         self._string(message), site))

    def document(self, record: logging.LogRecord) -> dict[str, Any]:
        """The ECS fields for one record; message args are rendered here, off the caller."""
        try:
            message = record.getMessage()
        except Exception as exc:  # a bad format string must not kill the writer
            message = f"{record.msg!r} (message formatting failed: {exc!r}; args={record.args!r})"
        doc: dict[str, Any] = {
            "@timestamp": self.timestamp(record.created),
            "log.level": record.levelname.lower(),
            "message": message,
            "ecs.version": ECS_VERSION,
            "log": {"logger": record.name,
                    "origin": {"file": {"name": record.filename, "line": record.lineno},
                               "function": record.funcName}},
            "service": self.service,
            "host": self.host,
            "process": {"pid": record.process, "thread": {"name": record.threadName}},
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
