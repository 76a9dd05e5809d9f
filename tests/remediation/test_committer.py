"""Group commit: concurrent deliveries are all recorded, and one payload that fails to record
does not take the others of its batch down with it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.remediation.helpers import alert, payload
from trainwatch.remediation.committer import CommitFailed, GroupCommitter, _Job
from trainwatch.remediation.playbooks import parse_playbook
from trainwatch.remediation.store import Store

BOOK = parse_playbook({"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
                       "target": ["training_job"],
                       "steps": [{"action": "http", "url": "http://127.0.0.1:1/x"}]},
                      Path("inline.yaml"))


def test_concurrent_deliveries_are_all_recorded(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    committer = GroupCommitter(store, {"page": BOOK}, escalate=False)
    bodies = [payload(alert("TrainingLossSpike", {"training_job": f"j{i}"})) for i in range(200)]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(committer.submit, bodies))
    assert sum(r.accepted for r in results) == 200
    assert store.state_counts() == {"pending": 200}


def test_a_failing_payload_fails_alone(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    committer = GroupCommitter(store, {"page": BOOK}, escalate=False)
    broken = payload(alert("TrainingLossSpike", {"training_job": "x"}))
    broken["alerts"] = None  # envelope validation would stop this; the committer too
    with pytest.raises(CommitFailed):
        committer.submit(broken)
    good = committer.submit(payload(alert("TrainingLossSpike", {"training_job": "y"})))
    assert good.accepted == 1 and store.state_counts() == {"pending": 1}


def test_a_failing_payload_does_not_sink_the_others_of_its_batch(tmp_path: Path) -> None:
    """Both deliveries in ONE batch (one transaction): only the savepoint keeps the good one."""
    store = Store(tmp_path / "s.sqlite")
    committer = GroupCommitter(store, {"page": BOOK}, escalate=False)
    broken = payload(alert("TrainingLossSpike", {"training_job": "x"}))
    broken["alerts"] = None
    bad_job = _Job(broken)
    good_job = _Job(payload(alert("TrainingLossSpike", {"training_job": "y"})))
    committer._commit([bad_job, good_job])
    assert bad_job.error is not None and bad_job.result is None
    assert good_job.error is None and good_job.result is not None
    assert good_job.result.accepted == 1
    assert store.state_counts() == {"pending": 1}


def test_a_large_delivery_moves_in_every_transaction_however_many_small_ones_arrive(
        tmp_path: Path) -> None:
    """Small deliveries go first, up to BATCH_ALERTS alerts per transaction, but the oldest
    delivery gets a part of every transaction: a steady stream of small ones cannot starve
    a large one until its deadline."""
    from trainwatch.remediation.committer import BATCH_ALERTS, MAX_BATCH
    store = Store(tmp_path / "s.sqlite")
    committer = GroupCommitter(store, {"page": BOOK}, escalate=False)
    big = _Job(payload(*[alert("TrainingLossSpike", {"training_job": f"b{i}"})
                         for i in range(2 * BATCH_ALERTS)]), seq=1)
    smalls = [_Job(payload(alert("TrainingLossSpike", {"training_job": f"s{i}"})), seq=2 + i)
              for i in range(BATCH_ALERTS + 10)]
    committer._commit([*smalls, big])  # the committer's order: smaller first
    assert 0 < big.recorded < big.size and not big.done.is_set()
    small_ones = min(MAX_BATCH, BATCH_ALERTS)
    assert sum(job.done.is_set() for job in smalls) == small_ones
    assert store.state_counts() == {"pending": small_ones + big.recorded}
