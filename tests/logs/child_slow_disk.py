"""A stand-in training process with a slow disk: 8 threads log at once, then SIGTERM comes.

Run as a script by tests/logs/test_handler_slow_disk.py (a real child process), never imported
by it except for `SlowDisk`.
    child_slow_disk.py DIR THREADS PER_THREAD WAKE_BATCHES
Every write sleeps first (a disk that answers, slowly). WAKE_BATCHES 0 keeps the default wake-up
policy (with the capacity and timer used here nothing is written before SIGTERM: it all
waits); a small number makes the writer busy writing while the threads log. Once every thread has
logged, it prints "logged pending=N" (records and batches still waiting for the slow disk)
and waits for SIGTERM; the handler's hook must write it all before the process dies.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainwatch.exporters.rank.logs.handler import AsyncEcsHandler
from trainwatch.exporters.rank.logs.rotating_writer import RotatingJsonlWriter


class SlowDisk(RotatingJsonlWriter):
    """The real rotating writer behind a disk that takes `delay` seconds for every write the
    handler asks for (once per call, however the writer splits it to rotate)."""

    def __init__(self, path: Path, delay: float, **kwargs: int) -> None:
        super().__init__(path, **kwargs)
        self.delay = delay
        self.writes = 0
        self.entered = threading.Event()
        self._inside = False

    def _slowly(self, write: Callable[[Any], None], data: Any) -> None:
        if self._inside:  # write_blocks rotating block by block: one write already
            write(data)
            return
        self.writes += 1
        self.entered.set()
        time.sleep(self.delay)
        self._inside = True
        try:
            write(data)
        finally:
            self._inside = False

    def write_lines(self, lines: list[bytes]) -> None:
        self._slowly(super().write_lines, lines)

    def write_block(self, block: bytes) -> None:
        self._slowly(super().write_block, block)

    def write_blocks(self, blocks: list[bytes]) -> None:
        self._slowly(super().write_blocks, blocks)


def main() -> None:
    directory, threads, per_thread, wake = (Path(sys.argv[1]), int(sys.argv[2]),
                                            int(sys.argv[3]), int(sys.argv[4]))
    disk = SlowDisk(directory / "rank-0.jsonl", delay=0.3, max_bytes=2_000_000,
                    backup_count=1000)
    handler = AsyncEcsHandler(path=disk.path, job="slow-job", rank=0, writer=disk,
                              capacity=4 * threads * per_thread, flush_interval=3600.0,
                              close_timeout=60, wake_batches=wake or None)
    logger = logging.getLogger("child.slow")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    start = threading.Barrier(threads)

    def work(thread: int) -> None:
        start.wait()
        for i in range(per_thread):
            logger.info("t=%d i=%d", thread, i)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    pending = len(handler._queue) + len(handler._taken)
    print(f"logged pending={pending} writes={disk.writes}", flush=True)
    while True:  # SIGTERM ends this; the handler's hook must write everything first
        time.sleep(1)


if __name__ == "__main__":
    main()
