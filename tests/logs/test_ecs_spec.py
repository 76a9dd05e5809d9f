"""The handler's output against Elastic's ECS logging spec (vendored, see tests/logs/data/), and
its `layout="ecs-logging"` mode side by side with the `ecs-logging` package itself."""

from __future__ import annotations

import io
import json
import logging
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from trainwatch.exporters.rank.logs.handler import AsyncEcsHandler

SPEC = json.loads((Path(__file__).with_name("data") / "ecs_logging_spec.json").read_text())
ISO_UTC_MILLIS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
SPEC_TYPES: dict[str, Any] = {"string": str, "integer": int, "object": dict}


def _log_everything(logger: logging.Logger) -> None:
    """Records of every shape the handler has a separate path for."""
    logger.info("step %d loss=%.4f", 7, 0.25)
    logger.warning("plain text")
    logger.debug('quotes " and \\ backslash, newline\nand tab\t, unicode: ünïcødé ✓, "%s"', "x")
    logger.error("empty args %s", "")
    logger.info("")
    logger.info("values %s", [1, 2])  # mutable arg: rendered on the caller
    logger.info("with extras", extra={"tokens": 512, "custom": {"a": 1}, "http.method": "GET"})
    logger.info("percent %% sign with args %d", 5)
    logger.info("percent %% sign without args")
    logger.info("%(k)s by name", {"k": "v"})
    logger.info("with stack", stack_info=True)
    try:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    except RuntimeError:
        logger.exception("step %d failed", 9)
    logger.critical(12345)  # a non-string msg


def _new_logger(name: str, *handlers: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    for handler in handlers:
        logger.addHandler(handler)
    return logger


def _written_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _flatten(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat[name] = value
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def test_every_line_follows_the_ecs_logging_spec(tmp_path: Path) -> None:
    handler = AsyncEcsHandler(path=tmp_path / "rank-0.jsonl", job="spec-job", rank=3,
                              service="trainer", install_signal_handler=False)
    _log_everything(_new_logger("spec.test", handler))
    handler.close()
    lines = _written_lines(tmp_path / "rank-0.jsonl")
    assert len(lines) == 13
    fields = SPEC["fields"]
    ordered = [name for name, _ in sorted(
        ((n, f["index"]) for n, f in fields.items() if "index" in f), key=lambda x: x[1])]
    assert ordered == ["@timestamp", "log.level", "message"]
    for line in lines:
        pairs = json.loads(line, object_pairs_hook=list)
        keys = [key for key, _ in pairs]
        # Field order: the spec's indexed fields first, in index order (we always write message).
        assert keys[:3] == ordered, line
        assert len(keys) == len(set(keys)), line
        doc = json.loads(line)
        flat = _flatten(doc)
        for name, spec in fields.items():
            if spec.get("required"):
                assert name in flat, (name, line)
            if spec.get("top_level_field"):
                assert name in doc, (name, line)  # a dotted key at the top level, not nested
                head, _, tail = name.partition(".")
                assert tail not in doc.get(head, {}), (name, line)
            if name not in flat:
                continue
            value = flat[name]
            if spec["type"] == "datetime":
                assert ISO_UTC_MILLIS.match(value), value
                datetime.fromisoformat(value.replace("Z", "+00:00"))
            else:
                assert isinstance(value, SPEC_TYPES[spec["type"]]), (name, value)
        # ecs.version: the spec pins the major version ("1.x"); a full version is written.
        major = SPEC["ecs"]["version"].split(".")[0]
        assert re.fullmatch(rf"{major}\.\d+\.\d+", doc["ecs.version"]), doc["ecs.version"]
        # event.dataset: the spec's default is ${service.name}.
        assert flat["event.dataset"] == flat["service.name"] == "trainer"
        replacements = fields["labels"]["sanitization"]["key"]["replacements"]
        assert not any(ch in key for key in doc["labels"] for ch in replacements)
        assert doc["labels"] == {"training_job": "spec-job", "rank": "3"}
    docs = [json.loads(line) for line in lines]
    assert docs[0]["message"] == "step 7 loss=0.2500"
    assert docs[2]["message"].startswith('quotes " and \\ backslash, newline\nand tab\t, ünïcødé'
                                         [:30])
    assert docs[7]["message"] == "percent % sign with args 5"
    assert docs[8]["message"] == "percent %% sign without args"
    assert docs[9]["message"] == "v by name"
    assert docs[6]["tokens"] == 512 and docs[6]["custom"] == {"a": 1}
    assert "error" in docs[10] and docs[11]["error"]["message"].startswith("CUDA out of memory")
    assert docs[12]["message"] == "12345" and docs[12]["log.level"] == "critical"


def test_fast_and_general_paths_write_the_same_line(tmp_path: Path) -> None:
    """The batch encoder (cached call sites, one escape call per batch) and the per-record
    dict path must agree field for field, key order included."""
    handler = AsyncEcsHandler(path=tmp_path / "x.jsonl", job="j", rank=0,
                              install_signal_handler=False)
    logger = _new_logger("spec.paths", handler)
    records = []
    capture = logging.Handler()
    capture.handle = records.append  # type: ignore[assignment,method-assign]
    logger.addHandler(capture)
    for i in range(50):
        logger.info('n=%d "%s"', i, "ü\\")
    handler.close()
    formatter = handler._ecs
    fast = formatter.lines(records)
    general = [formatter.line(record) for record in records]
    assert fast == general


def test_ecs_logging_layout_matches_the_ecs_logging_package(tmp_path: Path) -> None:
    ecs_logging = pytest.importorskip("ecs_logging")
    ours = AsyncEcsHandler(path=tmp_path / "compat.jsonl", job="cmp-job", rank=1,
                           service="trainer", layout="ecs-logging", install_signal_handler=False)
    stream = io.StringIO()
    theirs = logging.StreamHandler(stream)
    theirs.setFormatter(ecs_logging.StdlibFormatter(extra=ours._ecs.extra))
    # Theirs first: it formats the live record before our caller-side capture freezes it.
    _log_everything(_new_logger("spec.compat", theirs, ours))
    ours.close()
    expected = stream.getvalue().splitlines()
    got = _written_lines(tmp_path / "compat.jsonl")
    assert len(expected) == len(got) == 13
    for mine, reference in zip(got, expected, strict=True):
        assert mine == reference


def test_unknown_layout_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="layout must be one of"):
        AsyncEcsHandler(path=tmp_path / "x.jsonl", job="j", rank=0, layout="gelf",
                        install_signal_handler=False)
    assert not (tmp_path / "x.jsonl").exists()


def test_a_bad_format_string_in_a_batch_costs_only_its_own_message(tmp_path: Path) -> None:
    """The batch encoder renders all messages at once; one record whose format string does not
    match its args sends the batch down the one-by-one path, and nothing is lost."""
    handler = AsyncEcsHandler(path=tmp_path / "x.jsonl", job="j", rank=0,
                              install_signal_handler=False)
    logger = _new_logger("spec.badformat", handler)
    logger.info("before %d", 1)
    logger.info("two placeholders %d %d", 1)  # wrong arity
    logger.info({"not": "a string"})
    logger.info("after %s", "x")
    handler.close()
    docs = [json.loads(line) for line in _written_lines(tmp_path / "x.jsonl")]
    assert len(docs) == 4 and docs[0]["message"] == "before 1"
    assert "message formatting failed" in docs[1]["message"]
    assert docs[2]["message"] == "{'not': 'a string'}"
    assert docs[3]["message"] == "after x"
    assert handler.format_errors == 0 and handler.written == 4
