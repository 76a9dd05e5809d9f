"""What an asynchronous save costs the training thread (issue 28, acceptance 4): the parts of
`save()` that waited on other threads for no reason. Each test fails on the code before:
a new commit thread per save (the caller waited for it to start) and a health check that
polled the shipper with 1 ms sleeps."""

from __future__ import annotations

import threading
import time as real_time
import types
from pathlib import Path

import pytest
import torch

from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank import client as client_module
from trainwatch.exporters.rank.checkpoint import CheckpointManager
from trainwatch.exporters.rank.client import TrainingMonitor
from trainwatch.exporters.rank.serial_thread import SerialThread

INFO = RankInfo("save-cost", 0, 0, 1, 0)


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_serial_thread_runs_calls_in_order_on_one_daemon_thread() -> None:
    worker = SerialThread("test-serial")
    seen: list[tuple[int, threading.Thread]] = []
    futures = [worker.submit(lambda i=i: seen.append((i, threading.current_thread())) or i)
               for i in range(5)]
    assert [f.result(timeout=10) for f in futures] == [0, 1, 2, 3, 4]
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
    threads = {id(t) for _, t in seen}
    assert len(threads) == 1 and seen[0][1].daemon and seen[0][1].name == "test-serial"
    worker.close()
    seen[0][1].join(10)
    assert not seen[0][1].is_alive()  # close lets it end


def test_serial_thread_hands_exceptions_to_the_future_and_keeps_going() -> None:
    worker = SerialThread("test-serial-errors")

    def fail() -> None:
        raise ValueError("boom")

    failed = worker.submit(fail)
    after = worker.submit(lambda: "still running")
    with pytest.raises(ValueError, match="boom"):
        failed.result(timeout=10)
    assert after.result(timeout=10) == "still running"
    worker.close()
    assert worker.submit(lambda: "a new thread after close").result(timeout=10) == \
        "a new thread after close"
    worker.close()


def test_every_asynchronous_save_commits_on_the_same_thread(tmp_path: Path) -> None:
    model, optimizer = _model()
    manager = CheckpointManager(tmp_path / "ckpt", model, optimizer, keep=2,
                                asynchronous=True, writer="thread")
    committers: list[threading.Thread] = []
    finish = manager._finish

    def recording(*args: object) -> None:
        committers.append(threading.current_thread())
        finish(*args)  # type: ignore[arg-type]

    manager._finish = recording  # type: ignore[method-assign]
    try:
        for step in range(1, 4):
            manager.save(step, loss=1.0)
            manager.wait()
    finally:
        manager.close()
    assert len(committers) == 3
    assert len({id(t) for t in committers}) == 1, "a thread started per save"
    assert committers[0] is not threading.current_thread()
    assert [e["step"] for e in manager.manifest()] == [2, 3]


def test_the_save_health_check_waits_for_the_shipper_without_polling(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sleep(_seconds: float) -> None:
        raise AssertionError("the training thread slept while waiting for the shipper")

    # the client module's view of `time`: everything real except sleep
    monkeypatch.setattr(client_module, "time", types.SimpleNamespace(
        monotonic=real_time.monotonic, perf_counter=real_time.perf_counter,
        time=real_time.time, sleep=no_sleep))
    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(tmp_path / "absent.sock"),
                              control=False, flush_interval=3600.0)
    try:
        for step in range(50):
            monitor.report(step, loss=torch.tensor(1.0))  # a tensor: only the shipper knows
        assert monitor._healthy_since_last_save()
        monitor.report(50, loss=torch.tensor(float("nan")))
        assert not monitor._healthy_since_last_save()
        assert monitor._healthy_since_last_save()  # counted once
    finally:
        monitor.close()


def test_a_manager_dropped_without_close_lets_its_commit_thread_end(tmp_path: Path) -> None:
    import gc

    model, optimizer = _model()
    manager = CheckpointManager(tmp_path / "ckpt", model, optimizer, keep=1,
                                asynchronous=True, writer="thread", staging="on_save")
    manager.save(1, loss=1.0)
    manager.wait()
    thread = manager._committer._thread
    assert thread is not None and thread.is_alive()
    del manager
    gc.collect()
    thread.join(10)
    assert not thread.is_alive(), "a dropped manager left its commit thread behind"
