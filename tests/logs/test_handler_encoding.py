"""The handler's fast batch encoder writes exactly what the general one (a dict per record)
writes, for plain records and for every kind of record that must leave the fast path."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from trainwatch.exporters.rank.logs.ecs import EcsFormatter
from trainwatch.exporters.rank.logs.handler import AsyncEcsHandler


def make_records() -> list[logging.LogRecord]:
    """One logger's records, made by the real Logger front end, at exact milliseconds."""
    made: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            made.append(record)

    logger = logging.getLogger("test.encoding")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    keep = Keep()
    logger.addHandler(keep)
    try:
        for i in range(300):
            logger.info("step %d loss=%.4f", i, 0.5)
        logger.warning('quote " backslash \\ newline \n tab \t unicode \u00e9 %s', "x")
        logger.debug("no args, 100%")  # % without args is not a format
        logger.error("%(a)s and %(b)d", {"a": "dict", "b": 2})
    finally:
        logger.removeHandler(keep)
    for index, record in enumerate(made):
        record.created = 1_700_000_000 + index / 8  # exact in binary: both roundings agree
    return made


def odd_records() -> list[logging.LogRecord]:
    """Records the fast path must hand to the general one."""
    stack = logging.LogRecord("odd", logging.INFO, "/x/odd.py", 3, "with stack", None, None)
    stack.stack_info = "Stack (most recent call last):\n  File x"
    extra = logging.LogRecord("odd", logging.INFO, "/x/odd.py", 4, "with extra", None, None)
    extra.__dict__["step"] = 7
    inline_extra = logging.LogRecord("odd", logging.INFO, "/x/odd.py", 5, "attr %s", ("x",), None)
    inline_extra.tokens = 1024  # type: ignore[attr-defined]  # a filter's attribute
    not_str = logging.LogRecord("odd", logging.INFO, "/x/odd.py", 6, ValueError("obj"), None, None)
    bad_format = logging.LogRecord("odd", logging.INFO, "/x/odd.py", 7, "%d", ("nan",), None)
    records = [stack, extra, inline_extra, not_str, bad_format]
    for index, record in enumerate(records):
        record.created = 1_700_000_100 + index / 4
    return records


def general(formatter: EcsFormatter, batch: list[logging.LogRecord]) -> list[dict]:
    return [json.loads(formatter.line(record)) for record in batch]


def as_lines(block: bytes) -> list[dict]:
    assert block.endswith(b"\n")
    return [json.loads(line) for line in block[:-1].split(b"\n")]


def test_plain_batch_is_exactly_the_general_encoding() -> None:
    formatter = EcsFormatter(service="svc", job="job", rank=1, host="h")
    batch = make_records()
    block = formatter.block(batch)
    assert block == b"".join(formatter.line(record) + b"\n" for record in batch)
    assert formatter.block(batch) == block  # and again from the caches


@pytest.mark.parametrize("position", [0, 150, -1])
def test_any_odd_record_in_a_batch_is_written_like_the_general_path(position: int) -> None:
    formatter = EcsFormatter(service="svc", job="job", rank=1, host="h")
    for odd in odd_records():
        batch = make_records()
        batch.insert(position if position >= 0 else len(batch), odd)
        block = formatter.block(batch)
        assert as_lines(block) == general(formatter, batch)
        assert list(as_lines(block)[position].keys()) == list(
            general(formatter, [odd])[0].keys())  # same field order too


def test_stack_info_and_extras_reach_the_file(tmp_path: Path) -> None:
    """A record with stack_info but no error must not take the fast path, which has no
    stack (an encoder that sent it there lost the stack)."""
    handler = AsyncEcsHandler(tmp_path, job="enc", rank=0, batch_size=4,
                              install_signal_handler=False)
    logger = logging.getLogger(f"test.stack.{id(handler)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    for i in range(8):
        logger.info("i=%d", i, stack_info=i == 1, extra={"step": i} if i == 6 else None)
    handler.close()
    with (tmp_path / "enc" / "rank-0.jsonl").open("rb") as lines:
        docs = [json.loads(line) for line in lines]
    assert [doc["message"] for doc in docs] == [f"i={i}" for i in range(8)]
    assert docs[1]["error"]["stack_trace"].startswith("Stack (most recent call last)")
    assert docs[6]["step"] == 6
    assert all("error" not in doc for index, doc in enumerate(docs) if index != 1)


def test_file_name_comes_from_pathname_on_both_paths() -> None:
    """The fast path keys its call-site cache by `pathname` (LogRecord's `filename` is a fresh
    string per record, costly to hash), so `log.origin.file.name` is derived from `pathname`;
    the general path does the same, so both write one name for one record."""
    formatter = EcsFormatter(service="svc", job="job", rank=1, host="h")
    record = logging.LogRecord("x", logging.INFO, "/src/train.py", 7, "m %d", (1,), None)
    record.filename = "rewritten.py"  # only filename changed: pathname decides
    fast = as_lines(formatter.block([record]))[0]
    assert fast["log"]["origin"]["file"]["name"] == "train.py"
    assert fast == json.loads(formatter.line(record))
