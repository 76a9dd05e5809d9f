"""The goodput model on its own: a rank's timeline, the node ledger and its durable state.

The end-to-end proof with a real torchrun job is tests/training/test_goodput_job.py; these
cases pin the arithmetic (every second in exactly one kind, discards, incarnations) and the
ledger's promises (never backwards, no double count across an exporter restart); the last
reads the negative intervals from a real exporter's /metrics.
"""

from __future__ import annotations

import socket
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.net import wait_until
from tests.training.support import exporter
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract import goodput as gp
from trainwatch.exporters.contract.wire import VERSION, WireError, decode, encode
from trainwatch.exporters.node.training import ledger as gl
from trainwatch.exporters.rank import goodput as rg


class Manager(SimpleNamespace):
    """Stands in for a CheckpointManager: only the events its decorated methods record."""

    def __init__(self) -> None:
        super().__init__(goodput_events=deque(maxlen=256), seq=0)

    def event(self, kind: str, start: float, end: float, step: int | None) -> None:
        self.seq += 1
        self.goodput_events.append((self.seq, kind, start, end, step))


def test_blocking_records_outermost_call_with_its_step() -> None:
    class Saver:
        @rg.blocking(rg.SAVE)
        def wait(self) -> None:
            pass

        @rg.blocking(rg.SAVE)
        def save(self, step: int) -> str:
            self.wait()  # nested: counted once, as the save
            return "ok"

        @rg.blocking(rg.RESTORE)
        def rollback(self) -> SimpleNamespace:
            return SimpleNamespace(step=40)

        @rg.blocking(rg.RESTORE)
        def resume(self) -> None:  # no checkpoint: started from scratch
            return None

        @rg.blocking(rg.RESTORE)
        def broken(self) -> None:
            raise RuntimeError("a rank could not read it")

        @rg.blocking(rg.SAVE, when=lambda self: False)
        def idle_wait(self) -> None:
            pass

    saver = Saver()
    assert saver.save(30) == "ok"
    saver.rollback()
    saver.wait()
    saver.resume()
    with pytest.raises(RuntimeError):
        saver.broken()
    saver.idle_wait()  # not timed at all
    kinds = [(kind, step) for _, kind, _, _, step in saver.goodput_events]
    assert kinds == [(rg.SAVE, 30), (rg.RESTORE, 40), (rg.SAVE, None), (rg.RESTORE, -1),
                     (rg.RESTORE, None)]


def account_with_steps(manager: Manager | None = None) -> rg.RankAccount:
    account = rg.RankAccount(start_perf=0.0, checkpoints=manager)
    return account


def test_rank_timeline_splits_every_second_into_one_kind() -> None:
    manager = Manager()
    account = account_with_steps(manager)
    manager.event(rg.RESTORE, 2.0, 3.0, -1)  # resume found no checkpoint
    account.step(4.0, data_wait=0.5)  # first report: startup 2.5, restore 1, data 0.5
    t = 4.0
    for _ in range(10):  # 1 s steps, 0.25 s of each waiting for data
        t += 1.0
        account.step(t, data_wait=0.25)
    manager.event(rg.SAVE, t + 0.1, t + 0.6, 10)  # save after step 10: mark
    t += 1.5
    account.step(t, data_wait=0.0)
    t += 30.0  # a stall: 30 s where 1 s steps were usual
    account.step(t, data_wait=0.0)
    account.finish(t + 0.2)
    s = account.seconds
    assert s["startup"] == pytest.approx(2.5)
    assert s["checkpoint_restore"] == pytest.approx(1.0)
    assert s["data_wait"] == pytest.approx(0.5 + 10 * 0.25)
    assert s["checkpoint_save"] == pytest.approx(0.5)
    assert s["stall"] == pytest.approx(30.0 - 0.75)  # beyond the median step
    assert s["unattributed"] == pytest.approx(0.2)
    assert s["productive"] == pytest.approx(10 * 0.75 + 1.0 + 0.75)
    assert sum(s.values()) == pytest.approx(t + 0.2)  # wall: process start to finish
    assert account.resumed == -1
    assert account.marks[-1] == (10, pytest.approx(7.5))


def test_a_save_is_marked_before_the_next_step_report_and_only_once() -> None:
    """A save that ended after the last report is marked as soon as every report queued
    before it is counted, with the goodput of the step it saved; the next report books its
    seconds without a second mark. A restore stops the scan (the next report applies it)."""
    manager = Manager()
    account = account_with_steps(manager)
    for t in (1.0, 2.0, 3.0):
        account.step(t, None)  # startup, then 2 s productive
    manager.event(rg.SAVE, 3.1, 3.4, 3)
    assert not account.mark_saves(lambda: False)  # a report before the save is still queued
    assert list(account.marks) == []
    assert account.mark_saves(lambda: True)
    assert list(account.marks) == [(3, pytest.approx(2.0))]
    assert not account.mark_saves(lambda: True)  # once
    killed_here = gp.parse(account.wire(3.5))
    assert killed_here is not None
    assert killed_here.goodput - gp.mark_at(killed_here.marks, 3) == 0.0  # nothing discarded
    account.step(4.0, None)
    assert list(account.marks) == [(3, pytest.approx(2.0))]
    assert account.seconds["checkpoint_save"] == pytest.approx(0.3)
    manager.event(rg.RESTORE, 4.1, 4.2, 3)
    manager.event(rg.SAVE, 4.3, 4.4, 5)
    assert not account.mark_saves(lambda: True)  # behind a restore: left to the next report
    account.step(5.0, None)
    assert [m[0] for m in account.marks] == [3, 5]


def test_rollback_discards_progress_since_the_restored_checkpoint_once() -> None:
    manager = Manager()
    account = account_with_steps(manager)
    account.step(1.0, None)  # startup
    t = 1.0
    for step in range(1, 21):
        t += 1.0
        account.step(t, None)
        if step in (5, 10):
            manager.event(rg.SAVE, t + 0.01, t + 0.01, step)
    # rollback to step 10 after step 20: steps 11..20 (10 s) are thrown away
    manager.event(rg.RESTORE, t + 0.1, t + 0.3, 10)
    t += 1.0
    account.step(t, None)
    assert account.discarded == pytest.approx(10.0)
    assert account.goodput == pytest.approx(10.0 + 0.8)  # steps 1..10, then 1 s - 0.2 s restore
    # a second rollback, to step 5: only the kept progress since 5 is discarded again
    manager.event(rg.RESTORE, t + 0.1, t + 0.1, 5)
    t += 1.0
    account.step(t, None)
    assert account.discarded == pytest.approx(10.0 + 5.8)
    # a rollback that failed on some rank changed nothing: its time is restore, no discard
    manager.event(rg.RESTORE, t + 0.1, t + 0.5, None)
    t += 1.0
    account.step(t, None)
    assert account.discarded == pytest.approx(10.0 + 5.8)
    assert account.seconds["productive"] - account.discarded == pytest.approx(account.goodput)


def report(g: rg.RankAccount, at: float) -> gp.RankGoodput:
    """The datagram `g` sends at its perf_counter time `at`."""
    parsed = gp.parse(g.wire(at))
    assert parsed is not None
    return parsed


def test_ledger_incarnations_downtime_stall_and_restart_discard(tmp_path: Path) -> None:
    now = [1000.0]
    ledger = gl.Ledger(gl.LedgerFile(tmp_path / "g.db"), wall=lambda: now[0], zero_hold=0)
    old = [rg.RankAccount(0.0, Manager()) for _ in range(2)]  # both started at 1000
    for rank, account in enumerate(old):
        t = 2.0
        account.step(t, None)  # startup 2 s
        for step in range(1, 11):
            t += 1.0
            account.step(t, None)
            if step == 5:
                account._checkpoints.event(rg.SAVE, t, t, 5)
        ledger.ingest("job-a", "inc1", rank, False, report(account, 15.0), 1000.0 + 15.0)
    # killed at 1015 (last heartbeat); relaunched processes start at 1020
    new = [rg.RankAccount(0.0, Manager()) for _ in range(2)]
    for rank, account in enumerate(new):
        ledger.ingest("job-a", "inc2", rank, False, report(account, 0.5), 1020.5)
    totals = ledger.totals(["job-a"])["job-a"]
    assert totals["stall"] == pytest.approx(2 * 3.0)  # last report 1012 -> heartbeat 1015
    assert totals["downtime"] == pytest.approx(2 * 5.0)
    assert totals["discarded_restart"] == 0.0  # not known until the new ranks resumed
    new[0].resumed = 5
    ledger.ingest("job-a", "inc2", 0, False, report(new[0], 1.0), 1021.0)
    totals = ledger.totals(["job-a"])["job-a"]
    # each slot's old rank kept 10 s, of which 5 s were saved at step 5; slot by slot
    assert totals["discarded_restart"] == pytest.approx(5.0)
    new[1].resumed = 5
    ledger.ingest("job-a", "inc2", 1, False, report(new[1], 1.0), 1021.0)
    ledger.ingest("job-a", "inc2", 1, False, report(new[1], 1.2), 1021.2)  # once
    totals = ledger.totals(["job-a"])["job-a"]
    assert totals["discarded_restart"] == pytest.approx(2 * 5.0)
    parts = sum(totals[k] for k in gp.KINDS)
    assert parts == pytest.approx(totals["wall"])
    assert totals["wall"] == pytest.approx(2 * 15.0 + 2 * 5.0)
    # a late datagram of the retired incarnation changes nothing
    ledger.ingest("job-a", "inc1", 1, False, report(old[1], 30.0), 1030.0)
    assert ledger.totals(["job-a"])["job-a"] == totals


def test_ledger_survives_restart_without_reset_or_double_count(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    account = rg.RankAccount(0.0, None)
    account.step(1.0, None)
    for t in range(2, 12):
        account.step(float(t), 0.1)
    ledger = gl.Ledger(gl.LedgerFile(path), zero_hold=0)
    ledger.ingest("job-b", "inc1", 0, False, report(account, 11.0), 1011.0)
    ledger.flush()  # what the collector does before it serves the totals
    served = ledger.totals(["job-b"])["job-b"]
    ledger.ingest("job-b", "inc1", 0, False, report(account, 11.5), 1011.5)  # same totals
    del ledger  # the exporter dies without closing
    reopened = gl.Ledger(gl.LedgerFile(path), zero_hold=0)
    assert reopened.totals(["job-b"])["job-b"] == served
    for t in range(12, 15):
        account.step(float(t), 0.1)
    reopened.ingest("job-b", "inc1", 0, False, report(account, 14.0), 1014.0)
    after = reopened.totals(["job-b"])["job-b"]
    assert reopened.rank_seconds(["job-b"]) == {
        "job-b": {0: {"data_wait": pytest.approx(1.3), "checkpoint_save": 0.0}}}
    assert after["wall"] == pytest.approx(14.0)  # 1 s startup + 13 steps, counted once
    assert after["data_wait"] == pytest.approx(1.3)
    assert all(after[k] >= served[k] for k in served)


def test_datagram_goodput_is_validated() -> None:
    account = rg.RankAccount(0.0, None)
    base = {"v": 1, "job": "j", "rank": 0, "world_size": 1, "incarnation": "ab"}
    assert decode(encode({**base, "goodput": account.wire(1.0)})).goodput is not None
    for bad in ({"seconds": [1.0]}, {**account.wire(1.0), "seconds": [-1.0] * 7},
                {**account.wire(1.0), "marks": [["x", 1.0]]}, {**account.wire(1.0), "resumed": -2},
                {**account.wire(1.0), "age": float("nan")}, "x"):
        with pytest.raises(WireError):
            decode(encode({**base, "goodput": bad}))


def test_a_new_process_under_the_same_incarnation_id_is_counted_from_zero() -> None:
    ledger = gl.Ledger(zero_hold=0)
    first = rg.RankAccount(0.0, None)  # started at 1000
    first.step(1.0, None)
    for t in range(2, 11):
        first.step(float(t), None)
    ledger.ingest("job-c", "same", 0, False, report(first, 12.0), 1012.0)  # killed after 1012
    second = rg.RankAccount(0.0, None)  # relaunched at 1015, same incarnation id
    second.step(2.0, None)
    second.step(3.0, None)
    ledger.ingest("job-c", "same", 0, False, report(second, 3.0), 1018.0)
    totals = ledger.totals(["job-c"])["job-c"]
    assert totals["stall"] == pytest.approx(2.0)  # last report 1010 -> heartbeat 1012
    assert totals["downtime"] == pytest.approx(3.0)
    assert totals["startup"] == pytest.approx(1.0 + 2.0)
    assert totals["productive"] == pytest.approx(9.0 + 1.0)
    assert totals["wall"] == pytest.approx(18.0)


def steady(account: rg.RankAccount, until: float, every: float = 1.0) -> None:
    """Steps of `every` seconds after a 1 s startup, up to perf time `until`."""
    t = 1.0
    account.step(t, None)
    while t + every <= until + 1e-9:
        t += every
        account.step(t, None)


def test_a_new_jobs_counters_are_served_at_zero_first() -> None:
    now = [1000.0]
    ledger = gl.Ledger(wall=lambda: now[0], zero_hold=5.0)
    account = rg.RankAccount(0.0, None)
    steady(account, 3.0)  # the first datagram already holds 1 s of startup
    ledger.ingest("job-z", "inc1", 0, False, report(account, 3.0), 1000.0)
    assert ledger.jobs() == ["job-z"]
    assert set(ledger.totals(["job-z"])["job-z"].values()) == {0.0}  # born at zero
    now[0] = 1005.0
    totals = ledger.totals(["job-z"])["job-z"]
    assert totals["startup"] == pytest.approx(1.0) and totals["wall"] == pytest.approx(3.0)


def test_an_incarnation_that_ends_for_good_counts_its_hang_once() -> None:
    now = [1000.0]
    ledger = gl.Ledger(wall=lambda: now[0], zero_hold=0, end_after=30.0)
    for rank in (0, 1):
        account = rg.RankAccount(0.0, None)
        steady(account, 10.0)  # last step at 1010, then hung: heartbeats go on
        ledger.ingest("job-h", "inc1", rank, False, report(account, 40.0), 1040.0)
    ledger.settle()  # killed at 1040: not yet known
    assert ledger.totals(["job-h"])["job-h"]["stall"] == 0.0
    now[0] = 1070.0  # silent for end_after: ended for good, never relaunched
    ledger.settle()
    ledger.settle()  # once
    totals = ledger.totals(["job-h"])["job-h"]
    assert totals["stall"] == pytest.approx(2 * 30.0)
    assert totals["wall"] == pytest.approx(2 * 40.0)
    # relaunched after all, at 1100: only the downtime is added
    late = rg.RankAccount(0.0, None)
    ledger.ingest("job-h", "inc2", 0, False, report(late, 0.5), 1100.5)
    totals = ledger.totals(["job-h"])["job-h"]
    assert totals["stall"] == pytest.approx(2 * 30.0)
    assert totals["downtime"] == pytest.approx(60.0)


def test_a_process_back_from_a_long_stop_is_counted_once() -> None:
    now = [1000.0]
    ledger = gl.Ledger(wall=lambda: now[0], zero_hold=0, end_after=30.0)
    account = rg.RankAccount(0.0, None)
    steady(account, 10.0)
    ledger.ingest("job-s", "inc1", 0, False, report(account, 10.5), 1010.5)
    now[0] = 1050.0  # SIGSTOP at 1010.5 for 50 s: settled meanwhile
    ledger.settle()
    account.step(61.0, None)  # SIGCONT at 1060.5; its next step at 1061 (a stall)
    account.step(62.0, None)
    ledger.ingest("job-s", "inc1", 0, False, report(account, 62.0), 1062.0)
    totals = ledger.totals(["job-s"])["job-s"]
    assert totals["wall"] == pytest.approx(62.0)
    assert sum(totals[k] for k in gp.KINDS) == pytest.approx(totals["wall"])


def test_negative_intervals_are_counted_not_booked() -> None:
    ledger = gl.Ledger(zero_hold=0)
    old = rg.RankAccount(0.0, None)
    steady(old, 10.0)
    ledger.ingest("job-n", "inc1", 0, False, report(old, 12.0), 1012.0)
    # the next incarnation's process started at 1011, before the old one's last heartbeat
    new = rg.RankAccount(0.0, None)
    ledger.ingest("job-n", "inc2", 0, False, report(new, 1.0), 1012.0)
    totals = ledger.totals(["job-n"])["job-n"]
    assert totals["downtime"] == 0.0
    assert totals[gl.NEGATIVE] == 1
    # one the rank found itself (a report before the interval it closes) is counted too
    new.step(0.5, None)
    new.step(0.2, None)
    assert new.negative == 1
    ledger.ingest("job-n", "inc2", 0, False, report(new, 1.5), 1012.5)
    assert ledger.totals(["job-n"])["job-n"][gl.NEGATIVE] == 2


def test_a_real_exporter_serves_the_negative_intervals_it_counted(tmp_path: Path) -> None:
    """Issue 37 shape 5 ("a negative gap is dropped silently"), read where people look: a real
    training exporter's /metrics. A relaunched process placed before the old incarnation's
    last heartbeat (overlapping incarnations: a negative gap) and a report before the
    interval it closes (the rank's own count) each add one to
    training_node_negative_intervals_total; the negative gap is not booked as downtime."""
    job = "job-negative"
    with exporter(tmp_path, extra=("--goodput-zero-seconds", "0")) as exp, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:

        def send(incarnation: str, goodput: dict[str, Any]) -> None:
            sock.sendto(encode({"v": VERSION, "job": job, "rank": 0, "local_rank": 0,
                                "world_size": 1, "restarts": 0, "incarnation": incarnation,
                                "goodput": goodput}), str(exp.socket))

        def served(name: str) -> float:
            return sum(exp.samples(name, job).values())

        old = rg.RankAccount(0.0, None)
        steady(old, 10.0)
        send("a1" * 16, old.wire(10.0))
        wait_until(lambda: served(catalog.TRAINING_NODE_WALL) > 0, timeout=10,
                   what="the old incarnation's wall served")
        assert served(catalog.TRAINING_NODE_NEGATIVE_INTERVALS) == 0.0
        new = rg.RankAccount(0.0, None)
        new.step(0.5, None)
        new.step(0.2, None)  # a report before the interval it closes: the rank counts it
        assert new.negative == 1
        # 300 s old when it arrives: started long before the old one's last heartbeat here
        send("b2" * 16, new.wire(300.0))
        wait_until(lambda: served(catalog.TRAINING_NODE_NEGATIVE_INTERVALS) == 2.0,
                   timeout=10, what="both negative intervals served")
        downtime = exp.samples(catalog.TRAINING_NODE_TIME, job)
        assert [v for k, v in downtime.items() if ("kind", "downtime") in k] == [0.0]
