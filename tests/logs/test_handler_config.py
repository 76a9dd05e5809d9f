"""HandlerConfig: the handler's settings as one object, checked once; the keyword arguments
that scripts and logging configs pass build the same object."""

from __future__ import annotations

import dataclasses
import logging
import logging.config
import threading
from pathlib import Path

import pytest

from trainwatch.exporters.contract import catalog
from trainwatch.exporters.rank import AsyncEcsHandler, HandlerConfig


def _writer_threads() -> int:
    return sum(t.name.startswith("trainwatch-log-writer") for t in threading.enumerate())


def test_keywords_and_config_make_the_same_handler(tmp_path: Path) -> None:
    config = HandlerConfig(directory=tmp_path, job="cfg", rank=3, capacity=512, batch_size=64,
                           install_signal_handler=False)
    by_keywords = AsyncEcsHandler(tmp_path, job="cfg", rank=3, capacity=512, batch_size=64,
                                  install_signal_handler=False)
    by_config = AsyncEcsHandler(config=config)
    try:
        assert by_keywords.config == by_config.config == config
        assert by_keywords.path == by_config.path == tmp_path / "cfg" / "rank-3.jsonl"
        logger = logging.getLogger(f"test.config.{id(by_config)}")
        logger.propagate = False
        logger.addHandler(by_config)
        logger.warning("one")
    finally:
        by_keywords.close()
        by_config.close()
    assert by_config.path is not None and '"message":"one"' in by_config.path.read_text()


@pytest.mark.parametrize("bad", [
    {"layout": "xml"}, {"overflow": "wait"}, {"capacity": 0}, {"batch_size": 0},
    {"flush_interval": 0}, {"close_timeout": -1}, {"wake_batches": 0}, {"job": "../etc"},
    {"rank": -1},
])
def test_a_bad_setting_is_refused_before_anything_starts(tmp_path: Path, bad: dict) -> None:
    before = _writer_threads()
    with pytest.raises(ValueError):
        HandlerConfig(directory=tmp_path, **bad)
    with pytest.raises(ValueError):
        AsyncEcsHandler(tmp_path, **bad)
    assert _writer_threads() == before
    assert list(tmp_path.iterdir()) == []


def test_config_and_keywords_together_or_an_unknown_keyword_are_refused(tmp_path: Path
                                                                         ) -> None:
    config = HandlerConfig(directory=tmp_path, job="cfg", rank=0)
    with pytest.raises(TypeError, match="either config"):
        AsyncEcsHandler(config=config, capacity=10)
    with pytest.raises(TypeError, match="capacty"):
        AsyncEcsHandler(tmp_path, capacty=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.capacity = 1  # type: ignore[misc]


def test_dict_config_passes_its_keys_as_before(tmp_path: Path) -> None:
    """logging.config.dictConfig passes the handler's keys as keyword arguments."""
    name = "test.dictconfig.handler"
    logging.config.dictConfig({
        "version": 1, "disable_existing_loggers": False,
        "handlers": {"ecs": {"()": AsyncEcsHandler, "directory": str(tmp_path), "job": "dc",
                             "rank": 1, "install_signal_handler": False}},
        "loggers": {name: {"handlers": ["ecs"], "level": "INFO", "propagate": False}},
    })
    logger = logging.getLogger(name)
    (handler,) = logger.handlers
    try:
        assert isinstance(handler, AsyncEcsHandler) and handler.config.job == "dc"
        logger.info("configured")
    finally:
        handler.close()
        logger.removeHandler(handler)
    assert '"message":"configured"' in (tmp_path / "dc" / "rank-1.jsonl").read_text()


def test_without_a_directory_the_node_log_directory_of_the_environment_is_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job script that names no directory writes where the deploy's TaskProlog says
    (TRAINWATCH_LOG_DIR, the training log directory); without it, the refusal names it."""
    monkeypatch.delenv(catalog.ENV_LOG_DIR, raising=False)
    with pytest.raises(ValueError, match=catalog.ENV_LOG_DIR):
        AsyncEcsHandler(job="env", rank=0, install_signal_handler=False)
    monkeypatch.setenv(catalog.ENV_LOG_DIR, str(tmp_path))
    handler = AsyncEcsHandler(job="env", rank=1, install_signal_handler=False)
    handler.close()
    assert handler.path == tmp_path / "env" / "rank-1.jsonl"
    # a directory given still wins
    assert HandlerConfig(directory=tmp_path / "own").target("env", 0) == \
        tmp_path / "own" / "env" / "rank-0.jsonl"
