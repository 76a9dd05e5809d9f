"""Group commit for webhook intake: many concurrent deliveries share one fsync.

Each request thread validates its payload (the envelope, then every alert: CPU work that
must not run inside the store's single write transaction) and hands it to one committer
thread, then waits. The committer records queued payloads, each under its own SAVEPOINT (a
failure rolls back that payload only), in one BEGIN IMMEDIATE ... COMMIT with
synchronous=FULL, then wakes the waiters. So a 2xx still means "on disk", but a burst costs
one fsync per batch instead of one per request, and request threads never queue on the
store's write lock.

Large notifications (Alertmanager sends up to max_alerts per notification, 10,000 and more)
do not hold up the rest: one transaction records at most BATCH_ALERTS alerts, smaller
payloads go first, and a large payload is recorded in parts over several transactions, with
the payloads that arrive meanwhile recorded between its parts (the oldest payload gets a part
of every transaction, so a stream of small ones cannot starve it). A small alert behind three
10,000-alert notifications waits for one part, not for 30,000 alerts.

The answer says exactly what happened: 2xx when every alert of the payload is recorded; 503
(CommitFailed) when it was not, and then nothing more of it is recorded after the answer. A
waiter whose deadline passes abandons its payload: one still queued is never recorded, one
in progress stops at its next part (the parts recorded stay: the resend that the 503 asks for
finds them as duplicates, and records the rest). A part being committed when the deadline
passes is waited for, so a payload that was in fact recorded in full is answered 2xx.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainwatch.remediation.ingest import IngestResult, alert_problems, ingest_in
from trainwatch.remediation.playbooks import Playbook
from trainwatch.remediation.store import Store, StoreGone

log = logging.getLogger(__name__)
MAX_BATCH = 256  # payloads in one transaction
# Alerts recorded in one transaction: bounds how long any delivery waits behind another
# (SQLite here: ~0.1 s per 1,000 alerts; PostgreSQL a few round trips per alert).
BATCH_ALERTS = 500


class CommitFailed(RuntimeError):
    """The payload was not (wholly) recorded; the caller answers 5xx so Alertmanager retries
    (the alerts that were recorded are found as duplicates then)."""


@dataclass(eq=False)
class _Job:
    payload: dict[str, Any]
    problems: list[str | None] | None = None  # alert_problems(), made by the request thread
    done: threading.Event = field(default_factory=threading.Event)
    result: IngestResult | None = None
    error: BaseException | None = None
    recorded: int = 0  # alerts of the payload recorded (committed) so far
    committing: bool = False  # a part is in the transaction under way
    abandoned: bool = False  # its waiter gave up: record nothing more of it
    seq: int = 0  # arrival order
    _partial: IngestResult = field(default_factory=IngestResult)

    @property
    def size(self) -> int:
        alerts = self.payload.get("alerts")
        return len(alerts) if isinstance(alerts, list) else 0


class GroupCommitter:
    def __init__(self, store: Store, books: Mapping[str, Playbook], *, escalate: bool) -> None:
        self.store = store
        self.books = books
        self.escalate = escalate
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()  # the committer thread; also guards each job's flags
        self._arrivals = itertools.count(1)
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
        """Record `payload` durably; raises CommitFailed if that did not happen in time (and
        then nothing more of it is recorded)."""
        alerts = payload.get("alerts")
        problems = alert_problems(alerts) if isinstance(alerts, list) else None
        self._ensure_started()
        job = _Job(payload, problems, seq=next(self._arrivals))
        self._queue.put(job)
        if not job.done.wait(timeout):
            with self._lock:
                job.abandoned = True
                finished = job.done.is_set()
                if not finished and not job.committing:
                    self._finish(job, CommitFailed("not recorded in time"))
            # the part being committed now: its transaction is bounded by the store's lock
            # timeout; a second deadline only keeps a request from hanging on a dead thread
            if not job.done.wait(timeout):
                raise CommitFailed(self._recorded_note(job, "store did not finish in time"))
        if job.error is not None or job.result is None:
            if isinstance(job.error, CommitFailed):
                raise CommitFailed(self._recorded_note(job, str(job.error)))
            detail = f": {job.error}" if isinstance(job.error, StoreGone) else ""
            raise CommitFailed(self._recorded_note(
                job, f"store error: {type(job.error).__name__}{detail}"))
        return job.result

    @staticmethod
    def _recorded_note(job: _Job, message: str) -> str:
        if job.recorded:
            return (f"{message} ({job.recorded} of {job.size} alerts recorded: a resend finds "
                    "them as duplicates)")
        return message

    @staticmethod
    def _finish(job: _Job, error: BaseException | None) -> None:
        """Under the lock: the job is over (result or error), its waiter is woken."""
        if job.done.is_set():
            return
        if error is None:
            job.result = job._partial
        else:
            job.result, job.error = None, error
        job.done.set()

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="remediation-intake",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        pending: list[_Job] = []  # queued, or recorded in part (large payloads)
        while True:
            if not pending:
                pending.append(self._queue.get())
            while True:
                try:
                    pending.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            pending.sort(key=lambda job: job.size)  # stable: arrival order within one size
            self._commit(pending)
            pending = [job for job in pending if not job.done.is_set()]

    def _commit(self, waiting: list[_Job]) -> None:
        """Record the next part of as many of `waiting` as fit in one transaction (at most
        MAX_BATCH payloads and BATCH_ALERTS alerts, at least one part), in their order, and
        a part of the oldest one."""
        batch: list[tuple[_Job, int, int]] = []
        budget = BATCH_ALERTS
        with self._lock:
            for job in waiting:
                if job.done.is_set():
                    continue
                if job.abandoned:
                    self._finish(job, CommitFailed("not recorded in time"))
                    continue
                if len(batch) >= MAX_BATCH or (batch and budget <= 0):
                    continue  # the rest only finish abandoned jobs
                start = job.recorded
                stop = min(job.size, start + max(budget, 1))
                budget -= stop - start
                job.committing = True
                batch.append((job, start, stop))
            # Smaller payloads go first, but the oldest one always moves: a steady stream of
            # small deliveries must not starve a large one until its deadline.
            live = [job for job in waiting if not job.done.is_set()]
            oldest = min(live, key=lambda job: job.seq, default=None)
            if oldest is not None and not oldest.committing:
                start = oldest.recorded
                oldest.committing = True
                batch.append((oldest, start, min(oldest.size, start + BATCH_ALERTS // 4)))
        if not batch:
            return
        failed: dict[int, BaseException] = {}
        try:
            with self.store.transaction() as tx:
                for job, start, stop in batch:
                    try:
                        with tx.savepoint("delivery"):
                            ingest_in(self.store, tx, self.books, job.payload,
                                      escalate=self.escalate, problems=job.problems,
                                      part=(start, stop) if job.size else None,
                                      result=job._partial)
                    except Exception as exc:  # one bad payload must not sink the batch
                        log.exception("recording a delivery failed")
                        failed[id(job)] = exc
        except Exception as exc:  # the commit itself failed: nothing in the batch is stored
            log.exception("intake commit failed")
            self.last_failure = (time.monotonic(), f"{type(exc).__name__}: {exc}"[:300])
            with self._lock:
                for job, _, _ in batch:
                    job.committing = False
                    self._finish(job, exc)
            return
        if failed:
            first = next(iter(failed.values()))
            self.last_failure = (time.monotonic(), f"{type(first).__name__}: {first}"[:300])
        else:
            self.last_success = time.monotonic()
        with self._lock:
            for job, _, stop in batch:
                job.committing = False
                if id(job) in failed:
                    self._finish(job, failed[id(job)])
                    continue
                job.recorded = stop
                if stop >= job.size:
                    self._finish(job, None)
                elif job.abandoned:
                    self._finish(job, CommitFailed("not recorded in time"))
