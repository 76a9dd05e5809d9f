"""Issue 25 item 6, on both stores: large notifications do not stop intake. Alerts are
validated by the request thread, outside the store's single write transaction; a large
payload is recorded in parts with the deliveries that arrive meanwhile recorded between them;
and a delivery answered 503 is never recorded after the answer.

The store's write lock is held from outside (a second SQLite connection in BEGIN IMMEDIATE, or
a second PostgreSQL session holding the advisory write lock) so that deliveries queue up in a
known order, as they do behind a busy store."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.remediation.helpers import alert, payload, write_config
from tests.support.net import wait_until
from trainwatch.remediation import committer as committer_module
from trainwatch.remediation.committer import CommitFailed, GroupCommitter, _Job
from trainwatch.remediation.config import Config, load_config
from trainwatch.remediation.playbooks import parse_playbook
from trainwatch.remediation.store import Store
from trainwatch.remediation.stores import open_store

BOOK = parse_playbook({"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
                       "target": ["training_job"],
                       "steps": [{"action": "http", "url": "http://127.0.0.1:1/x"}]},
                      Path("inline.yaml"))
BIG = 10_000


@contextmanager
def write_lock_held(config: Config) -> Iterator[None]:
    """The store's write lock, taken by another connection until the block ends."""
    if config.postgresql is None:
        conn = sqlite3.connect(config.store_path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    from trainwatch.remediation.pgstore import WRITE_LOCK, connect
    pg = connect(config.postgresql)
    pg.execute("BEGIN")
    pg.execute("SELECT pg_advisory_xact_lock(?)", (WRITE_LOCK,))
    try:
        yield
    finally:
        pg.execute("ROLLBACK")
        pg.close()


def notification(tag: int, n: int) -> dict[str, Any]:
    """`n` distinct alerts; `tag` (0-255) keeps notifications apart."""
    return payload(*[alert("TrainingLossSpike", {"training_job": f"j{tag}-{i}"},
                           fingerprint=f"{tag:02x}{i:06x}") for i in range(n)])


def stored(store: Store) -> int:
    return sum(store.state_counts().values())


def committer_blocked(store: Store, committer: GroupCommitter) -> _Job:
    """Hand the committer one tiny delivery and wait until it took it (it now waits for the
    write lock with it): what is submitted next stays queued."""
    committer._ensure_started()
    blocker = _Job(notification(0xb0, 1))
    committer._queue.put(blocker)
    wait_until(committer._queue.empty, timeout=30, what="the committer to take the blocker")
    return blocker


def validated_beforehand(monkeypatch: pytest.MonkeyPatch, bodies: list[dict[str, Any]]) -> None:
    """Validate `bodies` now, before the write lock is taken: the request threads then find
    their result at once. The validation of 30,000 alerts takes tens of seconds on a loaded
    machine, longer than PostgreSQL's lock_timeout (30 s) for which the committer waits on the
    held lock with its blocker, which would then fail."""
    real = committer_module.alert_problems
    known = {id(body["alerts"]): real(body["alerts"]) for body in bodies}
    monkeypatch.setattr(committer_module, "alert_problems",
                        lambda alerts: known[id(alerts)] if id(alerts) in known else real(alerts))


def setup(tmp_path: Path, section: dict[str, Any]) -> tuple[Config, Store, GroupCommitter]:
    config = load_config(write_config(tmp_path, **section))
    store = open_store(config)
    return config, store, GroupCommitter(store, {"page": BOOK}, escalate=False)


def test_a_small_alert_behind_three_10000_alert_notifications_is_recorded_first(
        tmp_path: Path, store_section: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Three 10,000-alert notifications, then one small alert, queue behind a busy store. The
    small one is recorded (and answered) before the large ones are, instead of after all
    30,000 alerts (and their validation) in one transaction; the large ones are all recorded
    and answered 2xx."""
    config, store, committer = setup(tmp_path, store_section)
    bigs = [notification(k + 1, BIG) for k in range(3)]
    validated_beforehand(monkeypatch, bigs)
    results: dict[str, Any] = {}
    recorded_when_small_answered: list[int] = []

    def submit(name: str, body: dict[str, Any]) -> None:
        try:
            results[name] = committer.submit(body, timeout=500)
        except CommitFailed as exc:
            results[name] = exc
        if name == "small":
            recorded_when_small_answered.append(stored(store))

    with write_lock_held(config):
        blocker = committer_blocked(store, committer)
        threads = [threading.Thread(target=submit, args=(f"big{k}", body))
                   for k, body in enumerate(bigs)]
        for t in threads:
            t.start()
        wait_until(lambda: committer._queue.qsize() == 3, timeout=120,
                   what="the three large notifications queued")
        small = threading.Thread(target=submit, args=("small", notification(0x50, 1)))
        small.start()
        threads.append(small)
        wait_until(lambda: committer._queue.qsize() == 4, timeout=30,
                   what="the small alert queued")
    for t in threads:
        t.join(timeout=500)
    assert blocker.done.is_set() and blocker.error is None
    assert results["small"].accepted == 1, results["small"]
    # not after even one of the large notifications (the old code: after all three)
    assert recorded_when_small_answered[0] < BIG, recorded_when_small_answered
    for k in range(3):
        assert not isinstance(results[f"big{k}"], Exception), results[f"big{k}"]
        assert results[f"big{k}"].accepted == BIG
    assert stored(store) == 3 * BIG + 2


def test_a_delivery_answered_503_is_not_recorded_afterwards(
        tmp_path: Path, store_section: dict[str, Any]) -> None:
    """A delivery that waited past its deadline behind a busy store is answered 503 (not
    recorded, retry), and then it is not recorded behind the caller's back once the store is
    free again: the 503 is true, and the resend is the one that records it."""
    config, store, committer = setup(tmp_path, store_section)
    late = notification(0x1a, 50)
    with write_lock_held(config):
        blocker = committer_blocked(store, committer)
        with pytest.raises(CommitFailed):
            committer.submit(late, timeout=1.0)
    wait_until(blocker.done.is_set, timeout=60, what="the blocker recorded")
    assert committer.submit(notification(0xaf, 1)).accepted == 1  # the committer moved on
    fingerprints = {i["fingerprint"] for i in store.list_intents(1000)}
    assert not {a["fingerprint"] for a in late["alerts"]} & fingerprints
    assert committer.submit(late).accepted == 50  # the resend records it
