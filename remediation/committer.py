"""Group commit for webhook intake: many concurrent deliveries share one fsync.

Each request thread hands its validated payload to one committer thread and waits. The
committer takes everything queued, records each payload under its own SAVEPOINT (a failure
rolls back that payload only) in one BEGIN IMMEDIATE ... COMMIT with synchronous=FULL, then
wakes the waiters. So a 2xx still means "on disk", but a burst costs one fsync per batch
instead of one per request, and request threads never queue on SQLite's write lock.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from remediation.ingest import IngestResult, ingest_in
from remediation.playbooks import Playbook
from remediation.store import Store, StoreFileGone

log = logging.getLogger(__name__)
MAX_BATCH = 256


class CommitFailed(RuntimeError):
    """The payload was not recorded; the caller answers 5xx so Alertmanager retries."""


@dataclass
class _Job:
    payload: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: IngestResult | None = None
    error: BaseException | None = None


class GroupCommitter:
    def __init__(self, store: Store, books: Mapping[str, Playbook], *, escalate: bool) -> None:
        self.store = store
        self.books = books
        self.escalate = escalate
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        # readiness: the newest commit failure and success (time.monotonic()); /readyz fails
        # while the last commit failed, whatever a probe write manages
        self.last_failure: tuple[float, str] | None = None
        self.last_success = 0.0

    def failing(self) -> str | None:
        """Why intake is failing to commit right now, or None."""
        failure = self.last_failure
        if failure is None or failure[0] < self.last_success:
            return None
        return failure[1]

    def submit(self, payload: dict[str, Any], timeout: float = 30.0) -> IngestResult:
        """Record `payload` durably; raises CommitFailed if that did not happen in time."""
        self._ensure_started()
        job = _Job(payload)
        self._queue.put(job)
        if not job.done.wait(timeout):
            raise CommitFailed("store did not commit in time")
        if job.error is not None or job.result is None:
            detail = f": {job.error}" if isinstance(job.error, StoreFileGone) else ""
            raise CommitFailed(f"store error: {type(job.error).__name__}{detail}")
        return job.result

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="remediation-intake",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._commit(batch)

    def _commit(self, batch: list[_Job]) -> None:
        try:
            with self.store.transaction() as conn:
                for job in batch:
                    conn.execute("SAVEPOINT delivery")
                    try:
                        job.result = ingest_in(self.store, conn, self.books, job.payload,
                                               escalate=self.escalate)
                        conn.execute("RELEASE delivery")
                    except Exception as exc:  # one bad payload must not sink the batch
                        log.exception("recording a delivery failed")
                        conn.execute("ROLLBACK TO delivery")
                        conn.execute("RELEASE delivery")
                        job.result, job.error = None, exc
        except Exception as exc:  # the commit itself failed: nothing in the batch is stored
            log.exception("intake commit failed")
            self.last_failure = (time.monotonic(), f"{type(exc).__name__}: {exc}"[:300])
            for job in batch:
                job.result, job.error = None, exc
        else:
            errors = [job.error for job in batch if job.error is not None]
            if errors:
                self.last_failure = (time.monotonic(),
                                     f"{type(errors[0]).__name__}: {errors[0]}"[:300])
            else:
                self.last_success = time.monotonic()
        for job in batch:
            job.done.set()
