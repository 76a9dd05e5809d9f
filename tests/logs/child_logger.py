"""A stand-in training process for the handler tests: 4 threads log a known set of records.

Run as a script by the tests (a real child process), never imported by them.
    child_logger.py DIR MODE RECORDS
MODE "sigterm": log everything (the writer is told to wait, so it all stays queued), print
"logged", then wait for SIGTERM. MODE "exit": log everything and return from main without
closing anything, so only the atexit/logging.shutdown path can save the records.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from trainwatch.exporters.rank.logs.handler import AsyncEcsHandler


def main() -> None:
    directory, mode, records = sys.argv[1], sys.argv[2], int(sys.argv[3])
    handler = AsyncEcsHandler(directory, job="child-job", rank=3, capacity=records + 10,
                              batch_size=records + 10, flush_interval=3600.0)
    logger = logging.getLogger("child")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    per_thread = records // 4

    def work(thread: int) -> None:
        for i in range(per_thread):
            logger.info("t=%d i=%d", thread, i)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"logged queued={len(handler._queue)}", flush=True)
    if mode == "sigterm":
        while True:  # SIGTERM ends this; the handler's hook must flush first
            time.sleep(1)


if __name__ == "__main__":
    main()
