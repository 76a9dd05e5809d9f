"""`format="ecs-logging"`: lines exactly as Elastic's `ecs-logging` package writes them.

For users whose pipelines were built around `ecs_logging.StdlibFormatter`: the same field set
(`log.original`, `process.name`, `process.thread.id`, `error.*` from the exception), the same
nesting rules (dotted names expanded, `extra=` fields flattened and merged) and the same
serialisation (`@timestamp`, `log.level`, `message` first, the rest with sorted keys, ASCII
escapes, `repr()` for what JSON cannot hold). The handler's constant fields (service, dataset,
host, job and rank labels) are passed the way that formatter takes them, as its `extra=`.
tests/logs/test_ecs_spec.py compares the two side by side on the same records.

This mode trades speed for compatibility (stdlib json with sorted keys, one record at a time);
the default format follows the same ECS spec and is several times cheaper.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import traceback
from collections.abc import Mapping
from typing import Any

from trainwatch.exporters.rank.logs.ecs import render_message

# ecs-logging 2.x writes this; it is the version its field set was written against.
ECS_LOGGING_VERSION = "1.6.0"

_RECORD_ATTRS = ({
    "name", "msg", "args", "asctime", "levelname", "levelno", "pathname", "filename", "module",
    "exc_info", "exc_text", "stack_info", "lineno", "funcName", "created", "msecs",
    "relativeCreated", "thread", "threadName", "processName", "process", "message",
} | set(dir(logging.LogRecord("", 0, "", 0, "", (), None))) | {"_tw_error"})


def _fallback(value: Any) -> Any:
    try:
        return value.__structlog__()
    except AttributeError:
        return repr(value)


_dumps = functools.partial(json.dumps, sort_keys=True, separators=(",", ":"),
                           default=_fallback, ensure_ascii=True)


def _de_dot(name: str, value: Any) -> dict[str, Any]:
    parts = name.split(".")
    nested: dict[str, Any] = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        nested = {part: nested}
    return nested


def _merge(source: dict[str, Any], into: dict[str, Any]) -> None:
    for key, value in source.items():
        into.setdefault(key, {})
        if isinstance(value, dict) and isinstance(into[key], dict):
            _merge(value, into[key])
        elif into[key] != {}:
            raise TypeError(f"conflicting values for field {key!r}")
        else:
            into[key] = value


def _flatten(value: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, Mapping):
            for sub_key, sub_item in _flatten(item).items():
                name = f"{key}.{sub_key}"
                if name in flat:
                    raise ValueError(f"duplicate field {name!r} with different nesting")
                flat[name] = sub_item
        else:
            if key in flat:
                raise ValueError(f"duplicate field {key!r} with different nesting")
            flat[key] = item
    return flat


def capture_error_compat(record: logging.LogRecord) -> None:
    """The caller-side capture for this mode: ecs-logging's error fields, frozen as text.

    ecs-logging writes the class name, str(exception) and only the traceback frames
    (`traceback.format_tb`), falling back to `stack_info`.
    """
    exc_info = record.exc_info
    if not exc_info:
        return
    error: dict[str, Any] = {}
    if isinstance(exc_info, tuple) and exc_info[0] is not None:
        error["type"] = exc_info[0].__name__
    if isinstance(exc_info, tuple) and exc_info[1]:
        error["message"] = str(exc_info[1])
    if isinstance(exc_info, tuple) and exc_info[2] is not None:
        error["stack_trace"] = "".join(traceback.format_tb(exc_info[2])) or None
    record._tw_error = error  # type: ignore[attr-defined]
    record.exc_info = None
    record.exc_text = None


class EcsLoggingCompatFormatter:
    """Formats like `ecs_logging.StdlibFormatter(extra=self.extra)`."""

    def __init__(self, extra: dict[str, Any]) -> None:
        self.extra = dict(extra)

    def lines(self, batch: list[logging.LogRecord]) -> list[bytes]:
        return [self.line(record) for record in batch]

    def block(self, batch: list[logging.LogRecord]) -> bytes:
        """The batch as newline-terminated lines in one buffer (the writer's unit)."""
        return b"".join([self.line(record) + b"\n" for record in batch])

    def line(self, record: logging.LogRecord) -> bytes:
        return self.text(record).encode("ascii")

    def text(self, record: logging.LogRecord) -> str:
        message = render_message(record)
        error = getattr(record, "_tw_error", None) or {}
        stack = error.get("stack_trace") or (str(record.stack_info) if record.stack_info
                                             else None)
        fields = {
            "@timestamp": "%s.%03dZ" % (time.strftime("%Y-%m-%dT%H:%M:%S",  # noqa: UP031
                                                      time.gmtime(record.created)),
                                        record.msecs),
            "ecs.version": ECS_LOGGING_VERSION,
            "log.level": record.levelname.lower() if record.levelname else None,
            "log.origin.function": record.funcName,
            "log.origin.file.line": record.lineno,
            "log.origin.file.name": record.filename,
            "log.original": message,
            "log.logger": record.name,
            "process.pid": record.process,
            "process.name": record.processName,
            "process.thread.id": record.thread,
            "process.thread.name": record.threadName,
            "error.type": error.get("type"),
            "error.message": error.get("message"),
            "error.stack_trace": stack,
        }
        result: dict[str, Any] = {}
        for name, value in fields.items():
            if value is not None:
                _merge({name: value} if name == "ecs.version" else _de_dot(name, value), result)
        available = record.__dict__
        extras = _flatten({key: available[key] for key in available.keys() - _RECORD_ATTRS})
        for name, value in self.extra.items():
            _merge(_de_dot(name, value), extras)
        for name, value in extras.items():
            if value is not None:
                _merge(_de_dot(name, value), result)
        result.setdefault("message", message)
        return _ordered_dumps(result)


def _ordered_dumps(value: dict[str, Any]) -> str:
    """ecs-logging's layout: the spec's first three fields in order, then sorted keys."""
    first = []
    if "@timestamp" in value:
        first.append(("@timestamp", value.pop("@timestamp")))
    log = value.get("log")
    if isinstance(log, dict) and "level" in log:
        first.append(("log.level", log.pop("level")))
        if not log:
            value.pop("log")
    if "message" in value:
        first.append(("message", value.pop("message")))
    head = ",".join(f'"{key}":{_dumps(item)}' for key, item in first)
    if not value:
        return "{%s}" % head  # noqa: UP031
    return "{%s,%s" % (head, _dumps(value)[1:])  # noqa: UP031
