"""The handler's file is byte for byte what the handler wrote before issue 29 changed how its
writer is woken (and whatever changes next): a fixture of that handler's output, for both
layouts, from records that take every path (plain batches from several call sites, extras, an
exception, a stack, a mutable arg, a non-string message, a bad format string, escapes).

The fixtures in tests/logs/data/handler_golden_*.jsonl were written by the handler at commit
2579f78 (before issue 29). A deliberate change of the output regenerates them with
`TRAINWATCH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/logs/test_handler_golden.py`.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest

from trainwatch.exporters.rank.logs.handler import AsyncEcsHandler

DATA = Path(__file__).with_name("data")


def golden_records() -> list[logging.LogRecord]:
    """Records with every field the output depends on fixed (time, process, thread, site)."""
    records: list[logging.LogRecord] = []

    def record(name: str, level: int, line: int, func: str, msg: object,
               args: tuple | dict | None = None, **fields: object) -> logging.LogRecord:
        made = logging.LogRecord(name, level, f"/srv/train/{name}.py", line, msg, args, None,
                                 func)
        made.__dict__.update(fields)
        records.append(made)
        return made

    for i in range(700):  # several full batches, two call sites, a partial last batch
        if i % 3:
            record("train", logging.INFO, 40, "step", "step %d loss=%.4f", (i, 0.5 + i / 1024))
        else:
            record("data", logging.DEBUG, 12, "load", "shard %s rows=%d", (f"s{i}", i * 7))
    record("train", logging.WARNING, 41, "step",
           'quote " backslash \\ newline \n tab \t unicode \u00e9 \U0001f600 %s', ("x",))
    record("train", logging.INFO, 42, "step", "no args, 100%")
    record("train", logging.ERROR, 43, "step", "%(a)s and %(b)d", ({"a": "dict", "b": 2},))
    record("train", logging.INFO, 44, "step", "values %s", ([1, 2, 3],))  # mutable arg
    # One `extra=` key: the encoders write several in set order, which varies per process.
    record("train", logging.INFO, 45, "step", "with extras", None,
           trainer={"step": 7, "tokens": 1024})
    record("train", logging.INFO, 46, "step", "with stack", None,
           stack_info="Stack (most recent call last):\n  File \"/srv/train/train.py\"")
    record("train", logging.INFO, 47, "step", ValueError("not a string"))
    record("train", logging.INFO, 48, "step", "%d", ("nan",))  # bad format string
    error = record("train", logging.ERROR, 49, "step", "step %d failed", (8,))
    error.exc_info = (RuntimeError, RuntimeError("CUDA out of memory"), None)
    for i in range(300):
        record("train", logging.INFO, 50, "step", "tail %d", (i,))
    for index, made in enumerate(records):
        made.created = 1_700_000_000 + index / 8  # exact in binary
        made.msecs = (made.created % 1) * 1000
        made.process = 4242
        made.processName = "MainProcess"
        made.thread = 140_000_000_000_000 + index % 2
        made.threadName = "MainThread" if index % 2 else "data-loader"
    return records


def write_through_handler(directory: Path, layout: str) -> bytes:
    """What AsyncEcsHandler writes for the golden records, each handed to `handle()`."""
    handler = AsyncEcsHandler(path=directory / f"golden-{layout}.jsonl", job="golden-job",
                              rank=3, service="trainer", layout=layout,
                              install_signal_handler=False)
    for made in golden_records():
        handler.handle(made)
    handler.close()
    return (directory / f"golden-{layout}.jsonl").read_bytes()


@pytest.mark.parametrize("layout", ["ecs", "ecs-logging"])
def test_output_is_byte_identical_to_the_handler_before_issue_29(
        tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "golden-host")
    written = write_through_handler(tmp_path, layout)
    fixture = DATA / f"handler_golden_{layout}.jsonl"
    if os.environ.get("TRAINWATCH_UPDATE_GOLDEN") == "1":
        fixture.write_bytes(written)
    expected = fixture.read_bytes()
    assert written.count(b"\n") == len(golden_records())
    assert written == expected, next(
        (f"line {n}: {a!r} != {b!r}" for n, (a, b)
         in enumerate(zip(written.splitlines(), expected.splitlines(), strict=False))
         if a != b), "lengths differ")
