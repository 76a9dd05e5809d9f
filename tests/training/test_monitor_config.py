"""MonitorConfig: a TrainingMonitor's settings as one object, checked once before any thread
starts; the keyword arguments scripts pass build the same object."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank import MonitorConfig, TrainingMonitor

INFO = RankInfo("cfg-job", 0, 0, 1, 0)


def _shippers() -> int:
    return sum(t.name == "trainwatch-shipper" for t in threading.enumerate())


def test_keywords_and_config_make_the_same_monitor(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    sock = str(tmp_path / "absent.sock")
    config = MonitorConfig(socket_path=sock, sync_every=5, buffer_size=64, control=False)
    by_keywords = TrainingMonitor(rank_info=INFO, socket_path=sock, sync_every=5,
                                  buffer_size=64, control=False)
    by_config = TrainingMonitor(rank_info=INFO, config=config)
    try:
        assert by_keywords.config == by_config.config
        assert by_config.sync_every == 5 and by_config.config.socket_path == sock
        by_config.report(1, loss=1.0)
    finally:
        by_keywords.close()
        by_config.close()
    assert by_config.stats()["reported"] == 1


def test_the_environment_fills_what_is_left_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(catalog.ENV_SYNC_EVERY, "7")
    monkeypatch.setenv(catalog.ENV_EXPORTER_SOCKET, "/run/x/training.sock")
    resolved = MonitorConfig().resolved()
    assert (resolved.sync_every, resolved.socket_path) == (7, "/run/x/training.sock")


@pytest.mark.parametrize("bad", [
    {"sync_every": 0}, {"sync_every": True}, {"flush_interval": 0}, {"poll_interval": -1},
    {"buffer_size": 0},
])
def test_a_bad_setting_is_refused_before_any_thread_starts(bad: dict) -> None:
    before = _shippers()
    with pytest.raises(ValueError):
        MonitorConfig(**bad)
    with pytest.raises(ValueError):
        TrainingMonitor(rank_info=INFO, control=False, **bad)
    assert _shippers() == before


def test_a_bad_environment_is_refused_before_any_thread_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(catalog.ENV_SYNC_EVERY, "ten")
    before = _shippers()
    with pytest.raises(ValueError, match=catalog.ENV_SYNC_EVERY):
        TrainingMonitor(rank_info=INFO, control=False)
    assert _shippers() == before


def test_config_and_keywords_together_or_an_unknown_keyword_are_refused() -> None:
    with pytest.raises(TypeError, match="either config"):
        TrainingMonitor(rank_info=INFO, config=MonitorConfig(), sync_every=3)
    with pytest.raises(TypeError, match="sync_evry"):
        TrainingMonitor(rank_info=INFO, sync_evry=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        MonitorConfig().sync_every = 2  # type: ignore[misc]
