"""Issue 29, acceptance 3: with a slow disk (every write sleeps) and 8 threads logging at
once, nothing is lost on close() and nothing on SIGTERM; with overflow="block", nothing is
lost even when the records do not fit in the capacity."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.logs.child_slow_disk import SlowDisk
from trainwatch.exporters.rank.logs.handler import AsyncEcsHandler

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("child_slow_disk.py")
THREADS = 8


def read_in_order(path: Path) -> list[dict]:
    """Every line of a rotated log, oldest file first (`.N` is older than `.N-1`)."""
    rotated = sorted(path.parent.glob(f"{path.name}.*"), key=lambda p: -int(p.suffix[1:]))
    docs = []
    for part in [*rotated, path]:
        with part.open("rb") as handle:
            docs.extend(json.loads(line) for line in handle)
    return docs


def assert_all_once_in_order(docs: list[dict], threads: int, per_thread: int) -> None:
    """Each thread's records are all there, once each, in the order it logged them."""
    seen: dict[int, list[int]] = {t: [] for t in range(threads)}
    for doc in docs:
        thread, index = (int(part.split("=")[1]) for part in doc["message"].split())
        seen[thread].append(index)
    assert len(docs) == threads * per_thread
    for thread, indices in seen.items():
        assert indices == list(range(per_thread)), f"thread {thread}"


def log_from_threads(logger: logging.Logger, per_thread: int) -> None:
    start = threading.Barrier(THREADS)

    def work(thread: int) -> None:
        start.wait()
        for i in range(per_thread):
            logger.info("t=%d i=%d", thread, i)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert not worker.is_alive()


def new_logger(handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(f"test.slow.{id(handler)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger


@pytest.mark.parametrize("wake_batches", [None, 4])
def test_eight_threads_slow_disk_close_writes_everything_in_order(
        tmp_path: Path, wake_batches: int | None) -> None:
    """None: the default policy (the writer wakes on its timer); 4: it is woken every 4
    batches, so the threads log while the slow disk is busy; rotation on the way."""
    per_thread = 4_000
    disk = SlowDisk(tmp_path / "rank-0.jsonl", delay=0.05, max_bytes=2_000_000,
                    backup_count=1000)
    handler = AsyncEcsHandler(path=disk.path, job="slow-job", rank=0, writer=disk,
                              batch_size=128, flush_interval=0.05, close_timeout=60,
                              wake_batches=wake_batches, install_signal_handler=False)
    log_from_threads(new_logger(handler), per_thread)
    handler.close()
    assert disk.writes >= 2 and disk.rotations >= 2
    assert handler.dropped == 0 and handler.lost == 0
    assert handler.written == THREADS * per_thread
    assert_all_once_in_order(read_in_order(disk.path), THREADS, per_thread)


def test_eight_threads_slow_disk_overflow_block_loses_nothing_beyond_capacity(
        tmp_path: Path) -> None:
    """16,000 records through a capacity of 1,000: the callers wait for the slow disk."""
    per_thread = 2_000
    disk = SlowDisk(tmp_path / "rank-0.jsonl", delay=0.02, max_bytes=0)
    handler = AsyncEcsHandler(path=disk.path, job="slow-job", rank=0, writer=disk,
                              capacity=1_000, batch_size=50, overflow="block",
                              close_timeout=60, install_signal_handler=False)
    log_from_threads(new_logger(handler), per_thread)
    handler.close()
    assert disk.writes >= 16_000 // 1_000
    assert handler.dropped == 0 and handler.written == THREADS * per_thread
    assert_all_once_in_order(read_in_order(disk.path), THREADS, per_thread)


@pytest.mark.parametrize("wake_batches", [0, 4])
def test_eight_threads_slow_disk_sigterm_writes_everything_then_dies_of_sigterm(
        tmp_path: Path, wake_batches: int) -> None:
    """0: everything still waits when SIGTERM comes; 4: the slow disk is busy too."""
    per_thread = 3_000
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path), str(THREADS), str(per_thread),
         str(wake_batches)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    try:
        line = child.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("logged"), child.stderr.read()  # type: ignore[union-attr]
        fields = dict(part.split("=") for part in line.split()[1:])
        assert int(fields["pending"]) > 0  # records really were waiting when SIGTERM came
        if wake_batches:
            assert int(fields["writes"]) > 0  # and the slow disk was already busy
        child.send_signal(signal.SIGTERM)
        assert child.wait(120) == -signal.SIGTERM  # the default action still happens
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert_all_once_in_order(read_in_order(tmp_path / "rank-0.jsonl"), THREADS, per_thread)
