"""Background worker threads: claim intents from the store and hand them to the engine.

Any number of threads in any number of processes may share one store; the claim is an atomic
UPDATE with a lease, and a heartbeat renews the lease while a long action (an Ansible run)
is in progress, so only a dead process's work is taken over.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping

from trainwatch.remediation.config import Config
from trainwatch.remediation.engine import Engine
from trainwatch.remediation.lifecycle import LostLease
from trainwatch.remediation.pager import Pager
from trainwatch.remediation.playbooks import Playbook
from trainwatch.remediation.recovery import RecoveryTimes
from trainwatch.remediation.store import ClockSkew, ClockSuspect, Store

log = logging.getLogger(__name__)
PRUNE_EVERY = 3600.0  # seconds between retention passes
# The retention horizon moves at most this fraction of the retention per pass (Store.prune's
# max_step): a wall clock that leapt ahead unseen deletes at most a tenth of the retention
# early, and after a long stop retention catches up at several days per hourly pass.
RETENTION_STEP = 0.1
CLAIM_BACKOFF = 5.0  # seconds a worker thread waits after the store refused a claim


class Worker:
    def __init__(self, config: Config, store: Store, books: Mapping[str, Playbook]) -> None:
        self.config = config
        self.store = store
        self.books = books
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        # pages go out from one thread of their own, never from a worker's
        self.pager = Pager(config.pager_url, config.request_timeout_seconds)
        self._engines: list[Engine] = []
        self.recovery: RecoveryTimes | None = None  # set before start() to record them

    def start(self) -> None:
        for n in range(self.config.worker_threads):
            t = threading.Thread(target=self._loop, name=f"remediation-worker-{n}", daemon=True)
            t.start()
            self._threads.append(t)
        hb = threading.Thread(target=self._heartbeat, name="remediation-lease", daemon=True)
        hb.start()
        self._threads.append(hb)

    def alive(self) -> bool:
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    def stuck(self) -> int:
        """How many worker threads run a step well past its timeout (each outgoing call has
        a deadline, so one that is must be stuck in something else)."""
        now = time.monotonic()
        return sum(1 for engine in list(self._engines)
                   if engine.step_deadline is not None and now > engine.step_deadline)

    def wake(self) -> None:
        """Called after an accepted webhook so new work starts without waiting for a poll."""
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout)
        self.pager.stop()

    def _heartbeat(self) -> None:
        """Renews leases; also applies audit retention, once at start and then hourly."""
        self.store.use_worker_durability()
        next_prune = time.monotonic()
        holds = Engine(self.config, self.store, self.books, self.owner, self.pager)
        while True:
            try:
                holds.expire_holds()
            except Exception:
                log.exception("expiring approval holds failed")
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + PRUNE_EVERY
                try:
                    intents, audit = self.store.prune(
                        self.config.audit_retention_seconds,
                        max_step=self.config.audit_retention_seconds * RETENTION_STEP)
                    if intents or audit:
                        log.info("retention: removed %d finished intents, %d audit rows",
                                 intents, audit)
                except ClockSuspect as exc:  # the next pass looks again
                    log.error("%s", exc)
                except Exception:
                    log.exception("retention pass failed")
            if self._stop.wait(self.config.lease_seconds / 3):
                return
            try:
                self.store.renew_leases(self.owner, self.config.lease_seconds)
            except ClockSkew:  # logged by the store; the leases lapse as for a hung replica
                pass
            except Exception:
                log.exception("lease renewal failed")

    def _loop(self) -> None:
        self.store.use_worker_durability()
        engine = Engine(self.config, self.store, self.books, self.owner, self.pager)
        engine.recovery = self.recovery
        self._engines.append(engine)
        while not self._stop.is_set():
            try:
                intent = self.store.claim(self.owner, self.config.lease_seconds)
            except ClockSkew:  # the store logged it once; /readyz says so while it lasts
                self._stop.wait(CLAIM_BACKOFF)
                continue
            except Exception:
                log.exception("claim failed")  # a damaged or full store: /readyz says so
                self._stop.wait(CLAIM_BACKOFF)
                continue
            if intent is None:
                self._wake.wait(self.config.poll_interval_seconds)
                self._wake.clear()
                continue
            try:
                engine.process(intent)
            except LostLease:
                log.warning("lost the lease on intent %d; another process owns it", intent.id)
            except Exception as exc:
                log.exception("processing intent %d crashed", intent.id)
                # Give the intent back (counted as an attempt) rather than keep renewing a
                # lease on work nobody is doing: otherwise it stays 'running' until a restart.
                try:
                    engine.release_after_crash(intent, f"{type(exc).__name__}: {exc}")
                except Exception:
                    log.exception("could not release intent %d", intent.id)
