"""A job's slots across nodes (issue 37, shape 6): a restart that moves a slot to another node.

Each node's ledger counts the gap and the discarded work of a restart only for the slots whose
old rank it saw; a slot that moved is counted by its new node from the handoff its new rank
read from the old rank's record in the checkpoint directory (exporters/rank/lineage.py). The
real job on the Slurm test cluster is the fatal XID test of
tests/slurm/test_heal_pipeline.py; these pin the arithmetic and the records.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.net import wait_until
from trainwatch.exporters.contract import goodput as gp
from trainwatch.exporters.contract.wire import WireError, decode, encode
from trainwatch.exporters.node.training import ledger as gl
from trainwatch.exporters.rank import goodput as rg
from trainwatch.exporters.rank import lineage

INC1, INC2, INC3 = "a1" * 16, "b2" * 16, "c3" * 16


def rank_report(age: float, productive: float, *, resumed: int | None = None,
                previous: gp.Handoff | None = None, goodput: float | None = None,
                marks: list[tuple[int, float]] | None = None) -> gp.RankGoodput:
    """A datagram's goodput: `productive` seconds after a 1 s startup, `age` old."""
    seconds = dict.fromkeys(gp.RANK_KINDS, 0.0)
    if productive:
        seconds["startup"], seconds["productive"] = 1.0, productive
    return gp.RankGoodput(age=age, seconds=seconds, discarded=0.0,
                          goodput=productive if goodput is None else goodput,
                          marks=marks or [], resumed=resumed, previous=previous)


def job_totals(*ledgers: gl.Ledger, job: str = "job-m") -> dict[str, float]:
    """What the job-level rules add up: every node's counters of the job."""
    out: dict[str, float] = {}
    for ledger in ledgers:
        for key, value in ledger.totals([job]).get(job, {}).items():
            out[key] = out.get(key, 0.0) + value
    return out


def test_a_slot_moved_to_the_spare_is_counted_once_at_the_job_level() -> None:
    """inc1: rank 0 on A, rank 1 on B (both from 1000, a checkpoint at 1010 after 9 s of
    progress, last reports at 1020: 19 s of progress). B fails; inc2: rank 0 on A again,
    rank 1 on the spare C, both starting at 1030, resumed from the checkpoint."""
    now = [1000.0]
    nodes = {n: gl.Ledger(wall=lambda: now[0], zero_hold=0, end_after=30.0) for n in "ABC"}
    marks = [(10, 9.0)]
    for node, rank in (("A", 0), ("B", 1)):
        nodes[node].ingest("job-m", INC1, rank, False,
                           rank_report(20.0, 19.0, resumed=-1, marks=marks), 1020.0)
    now[0] = 1060.0
    nodes["B"].settle()  # B never hears of the job again
    handoff = gp.Handoff(INC1, downtime=1030.0 - 1020.0, discarded=None)
    nodes["A"].ingest("job-m", INC2, 0, False, rank_report(0.5, 0.0, previous=handoff),
                      1030.5)
    nodes["C"].ingest("job-m", INC2, 1, False, rank_report(0.5, 0.0, previous=handoff),
                      1030.5)
    resumed = gp.Handoff(INC1, downtime=10.0, discarded=19.0 - 9.0)
    for node, rank in (("A", 0), ("C", 1)):
        for at in (1035.0, 1036.0):  # the discard is booked once
            nodes[node].ingest("job-m", INC2, rank, False,
                               rank_report(at - 1030.0, at - 1031.0, resumed=10,
                                           previous=resumed), at)
    totals = job_totals(*nodes.values())
    assert totals["downtime"] == pytest.approx(2 * 10.0)  # both slots, 1020 -> 1030
    assert totals["discarded_restart"] == pytest.approx(2 * 10.0)
    assert totals["wall"] == pytest.approx(2 * 36.0)  # each slot 1000 -> 1036, once
    assert sum(totals[k] for k in gp.KINDS) == pytest.approx(totals["wall"])
    # before: C counted no downtime and nobody counted slot 1's discard (tested below for
    # the node that saw the old rank: it books its own slot only)
    assert nodes["C"].totals(["job-m"])["job-m"]["downtime"] == pytest.approx(10.0)
    assert nodes["A"].totals(["job-m"])["job-m"]["discarded_restart"] == pytest.approx(10.0)


def test_a_job_back_on_a_node_after_running_elsewhere_counts_only_the_last_gap() -> None:
    """Chaos soak bug 1: inc1 on A ends at 1020; inc2 runs on C from 1030 to 1100; inc3 comes
    back to A at 1110. A's own record of the job is inc1's: the gap since then (90 s) is not
    downtime, inc2 ran meanwhile; the handoff says 10 s."""
    now = [1000.0]
    a = gl.Ledger(wall=lambda: now[0], zero_hold=0, end_after=30.0)
    a.ingest("job-m", INC1, 0, False, rank_report(20.0, 19.0, resumed=-1), 1020.0)
    now[0] = 1060.0
    a.settle()
    back = gp.Handoff(INC2, downtime=10.0, discarded=None)
    a.ingest("job-m", INC3, 0, False, rank_report(0.5, 0.0, previous=back), 1110.5)
    totals = a.totals(["job-m"])["job-m"]
    assert totals["downtime"] == pytest.approx(10.0)  # was 90: inc1's end to inc3's start
    a.ingest("job-m", INC3, 0, False,
             rank_report(2.0, 1.0, resumed=5, previous=gp.Handoff(INC2, 10.0, 3.0)), 1112.0)
    # inc2's discard from the handoff; inc1's progress here was inc2's to count, not inc3's
    assert a.totals(["job-m"])["job-m"]["discarded_restart"] == pytest.approx(3.0)


def test_once_a_handoff_says_the_job_ran_elsewhere_no_slot_uses_the_old_end() -> None:
    """A grown job back on node A: rank 0 follows inc2 (which ran elsewhere), rank 1 is a new
    slot with no handoff. Neither gets A's gap since inc1's end."""
    a = gl.Ledger(zero_hold=0)
    a.ingest("job-m", INC1, 0, False, rank_report(20.0, 19.0, resumed=-1), 1020.0)
    a.ingest("job-m", INC3, 0, False,
             rank_report(0.5, 0.0, previous=gp.Handoff(INC2, 10.0, None)), 1110.5)
    a.ingest("job-m", INC3, 1, False, rank_report(0.5, 0.0), 1110.5)
    assert a.totals(["job-m"])["job-m"]["downtime"] == pytest.approx(10.0)  # was 10 + 90


def test_an_end_the_exporter_did_not_hear_is_the_old_ranks_not_downtime(
        tmp_path: Path) -> None:
    """Issue 37 shape 5: node A's exporter last hears rank 0 of inc1 at 1010 (1 s startup,
    9 s of progress, a checkpoint at step 5 after 4 s) and is then down; the rank runs on,
    unseen, to 1050 (40 s more progress, a checkpoint at step 40 after 39 s), and inc2
    starts on A at 1060, resumed from step 40. A's own record of inc1 ends at 1010; the old
    rank's record (the new rank's handoff) at 1050."""
    now = [1010.0]
    state = tmp_path / "g.db"
    a = gl.Ledger(gl.LedgerFile(state), wall=lambda: now[0], zero_hold=0, end_after=30.0)
    a.ingest("job-m", INC1, 0, False,
             rank_report(10.0, 9.0, resumed=-1, marks=[(5, 4.0)]), 1010.0)
    a.flush()
    del a  # the exporter dies; it is back at 1055, with what it had written
    now[0] = 1055.0
    a = gl.Ledger(gl.LedgerFile(state), wall=lambda: now[0], zero_hold=0, end_after=30.0)
    a.settle()  # silent since 1010: inc1 closed at its last heartbeat here
    handoff = gp.Handoff(INC1, downtime=1060.0 - 1050.0, discarded=None, goodput=49.0)
    a.ingest("job-m", INC2, 0, False, rank_report(0.5, 0.0, previous=handoff), 1060.5)
    totals = a.totals(["job-m"])["job-m"]
    assert totals["downtime"] == pytest.approx(10.0)  # was 50: 1010 -> 1060
    assert totals["productive"] == pytest.approx(49.0)  # was 9: the 40 s unseen were lost
    assert totals["unattributed"] == 0.0
    assert totals["wall"] == pytest.approx(60.0)
    resumed = gp.Handoff(INC1, downtime=10.0, discarded=49.0 - 39.0, goodput=49.0)
    a.ingest("job-m", INC2, 0, False, rank_report(2.0, 1.0, resumed=40, previous=resumed),
             1062.0)
    totals = a.totals(["job-m"])["job-m"]
    # steps 41..50, from the record's progress and marks (A's own, of 1010, said 9 - 4)
    assert totals["discarded_restart"] == pytest.approx(10.0)
    assert totals["wall"] == pytest.approx(62.0)
    assert sum(totals[k] for k in gp.KINDS) == pytest.approx(totals["wall"])
    a.flush()
    del a  # and once more: nothing is booked twice after a restart
    a = gl.Ledger(gl.LedgerFile(state), wall=lambda: now[0], zero_hold=0, end_after=30.0)
    a.ingest("job-m", INC2, 0, False, rank_report(2.0, 1.0, resumed=40, previous=resumed),
             1062.0)
    assert a.totals(["job-m"])["job-m"] == totals


def test_an_unheard_end_without_the_records_progress_is_unattributed() -> None:
    """The same from a rank whose handoff predates `goodput`: the wall and the gap are still
    right; the unseen seconds are unattributed (nothing says which kind they were)."""
    a = gl.Ledger(zero_hold=0)
    a.ingest("job-m", INC1, 0, False, rank_report(10.0, 9.0, resumed=-1), 1010.0)
    a.ingest("job-m", INC2, 0, False,
             rank_report(0.5, 0.0, previous=gp.Handoff(INC1, 10.0, None)), 1060.5)
    totals = a.totals(["job-m"])["job-m"]
    assert (totals["downtime"], totals["unattributed"]) == (pytest.approx(10.0),
                                                           pytest.approx(40.0))
    assert totals["wall"] == pytest.approx(60.0)


def test_a_record_no_newer_than_the_nodes_view_changes_nothing() -> None:
    """An exporter that heard the rank to its end keeps its own view: a record a few
    milliseconds newer (written after the last datagram was sent) or older (rewritten at
    most every interval) gives the same gap, and the node's own discard."""
    for lead in (0.004, -0.1):
        a = gl.Ledger(zero_hold=0)
        a.ingest("job-m", INC1, 0, False,
                 rank_report(20.0, 19.0, resumed=-1, marks=[(10, 9.0)]), 1020.0)
        handoff = gp.Handoff(INC1, 10.0 - lead, None, goodput=25.0)  # 25: not what A saw
        a.ingest("job-m", INC2, 0, False, rank_report(0.5, 0.0, previous=handoff), 1030.5)
        a.ingest("job-m", INC2, 0, False, rank_report(
            2.0, 1.0, resumed=10, previous=gp.Handoff(INC1, 10.0 - lead, 16.0, 25.0)), 1032.0)
        totals = a.totals(["job-m"])["job-m"]
        assert totals["downtime"] == pytest.approx(10.0)
        assert totals["productive"] == pytest.approx(19.0 + 1.0)
        assert totals["discarded_restart"] == pytest.approx(19.0 - 9.0)


def test_a_process_under_a_reused_id_still_books_its_slots_restart_discard() -> None:
    a = gl.Ledger(zero_hold=0)
    a.ingest("job-m", INC1, 0, False,
             rank_report(20.0, 19.0, resumed=-1, marks=[(10, 9.0)]), 1020.0)
    a.ingest("job-m", INC2, 0, False, rank_report(0.5, 0.0), 1030.5)
    # that process dies before its first step; the launcher starts another under the same id
    a.ingest("job-m", INC2, 0, False, rank_report(0.5, 0.0), 1040.5)
    a.ingest("job-m", INC2, 0, False, rank_report(3.0, 2.0, resumed=10), 1043.0)
    assert a.totals(["job-m"])["job-m"]["discarded_restart"] == pytest.approx(19.0 - 9.0)


def test_without_a_handoff_the_node_counts_what_it_saw() -> None:
    """No checkpoint manager (no records): the node's own gap, as before."""
    a = gl.Ledger(zero_hold=0)
    a.ingest("job-m", INC1, 0, False, rank_report(20.0, 19.0), 1020.0)
    a.ingest("job-m", INC2, 0, False, rank_report(0.5, 0.0), 1030.5)
    assert a.totals(["job-m"])["job-m"]["downtime"] == pytest.approx(10.0)


def write_record(directory: Path, rank: int, incarnation: str, end: float, *,
                 host: str = "node-a", local_rank: int = 0, local_world: int = 1,
                 goodput: float = 19.0, marks: list[list[float]] | None = None,
                 job: str = "job-m", **other: object) -> None:
    path = lineage.record_path(directory, rank)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"v": 1, "job": job, "incarnation": incarnation, "host": host,
                                "local_rank": local_rank, "local_world": local_world,
                                "end": end, "goodput": goodput,
                                "marks": marks if marks is not None else [[10, 9.0]],
                                **other}))


def test_the_predecessor_is_the_slot_record_of_rank_zeros_incarnation(tmp_path: Path) -> None:
    t = time.time() - 100.0
    write_record(tmp_path, 0, INC2, t)
    write_record(tmp_path, 1, INC2, t - 2.0, host="node-b", local_rank=0, local_world=2)
    write_record(tmp_path, 2, INC2, t + 0.5, host="node-b", local_rank=1, local_world=2)
    write_record(tmp_path, 3, INC1, t - 80.0)  # a slot inc2 did not have: stale
    one = lineage.read_predecessor(tmp_path, 1)
    assert one is not None and (one.incarnation, one.job) == (INC2, "job-m")
    # its node-mate lived on 2.5 s longer and its exporter closed both then: the gap starts there
    assert one.end == t + 0.5
    assert one.handoff(t + 10.0) == {"incarnation": INC2, "downtime": pytest.approx(9.5),
                                     "discarded": None, "goodput": 19.0}
    assert one.discarded(10) == pytest.approx(10.0) and one.discarded(-1) == 19.0
    assert lineage.read_predecessor(tmp_path, 3) is None
    assert lineage.read_predecessor(tmp_path, 4) is None  # a new slot
    (tmp_path / "lineage" / "rank-2.json").write_text("{half")  # torn or foreign: ignored
    assert lineage.read_predecessor(tmp_path, 1).end == t - 2.0  # type: ignore[union-attr]
    assert lineage.read_predecessor(tmp_path / "absent", 0) is None


@pytest.mark.parametrize("bad", [
    {"local_rank": 5, "local_world": 2}, {"local_rank": float("inf")},
    {"incarnation": "NOT-HEX"}, {"marks": [[1e999, 1.0]]}, {"marks": [[-1, 1.0]]},
    {"goodput": -1.0}, {"goodput": float("nan")}, {"v": 2}, {"end": 0.0},
    {"end": "now"}, {"job": None, "v": None},
])
def test_a_record_that_is_not_one_is_no_predecessor_and_never_raises(
        tmp_path: Path, bad: dict[str, object]) -> None:
    now = time.time()
    fields = {"incarnation": INC1, "end": now - 5.0, **bad}
    write_record(tmp_path, 0, str(fields.pop("incarnation")), fields.pop("end"),  # type: ignore[arg-type]
                 **fields)  # type: ignore[arg-type]
    assert lineage.read_predecessor(tmp_path, 0) is None


def test_a_record_in_the_far_future_a_link_a_fifo_or_a_huge_file_is_none(
        tmp_path: Path) -> None:
    write_record(tmp_path, 0, INC1, time.time() + 3600)  # a clock an hour ahead
    assert lineage.read_predecessor(tmp_path, 0) is None
    real = tmp_path / "elsewhere.json"
    write_record(tmp_path, 1, INC1, time.time())
    lineage.record_path(tmp_path, 1).rename(real)
    lineage.record_path(tmp_path, 0).unlink()
    lineage.record_path(tmp_path, 0).symlink_to(real)
    assert lineage.read_predecessor(tmp_path, 0) is None
    lineage.record_path(tmp_path, 0).unlink()
    os.mkfifo(lineage.record_path(tmp_path, 0))  # nobody writes: must not wait
    assert lineage.read_predecessor(tmp_path, 0) is None
    lineage.record_path(tmp_path, 0).unlink()
    write_record(tmp_path, 0, INC1, time.time(), padding="x" * lineage.MAX_RECORD_BYTES)
    assert lineage.read_predecessor(tmp_path, 0) is None


class Manager(SimpleNamespace):
    """Stands in for a CheckpointManager: its directory, rank, events and predecessor."""

    def __init__(self, directory: Path, rank: int) -> None:
        super().__init__(goodput_events=deque(maxlen=256), directory=directory, rank=rank,
                         predecessor=lineage.read_predecessor(directory, rank))


def record_of(directory: Path, rank: int = 0) -> dict[str, object] | None:
    path = lineage.record_path(directory, rank)
    return json.loads(path.read_text()) if path.exists() else None


def test_the_writer_keeps_the_newest_values_off_the_callers_thread(tmp_path: Path) -> None:
    writer = lineage.RecordWriter(tmp_path, "job-m", 0, 0, 1, interval=3600.0)
    writer.keep(INC1, 1.0, [])
    first = wait_until(lambda: record_of(tmp_path), timeout=10, what="the first record")
    assert (first["goodput"], first["job"]) == (1.0, "job-m")
    writer.keep(INC1, 2.0, [])  # within the interval, nothing new: not rewritten
    writer.keep(INC1, 3.0, [(5, 3.0)], force=True)  # a new checkpoint mark: at once
    assert record_of(tmp_path)["marks"] == [[5, 3.0]]  # type: ignore[index]
    writer.keep(INC1, 4.0, [(5, 3.0)], force=True)  # the last one: always, waited for
    assert record_of(tmp_path)["goodput"] == 4.0  # type: ignore[index]
    assert not list((tmp_path / "lineage").glob(".*.tmp"))


def test_a_new_mark_is_written_at_once_after_the_list_is_full(tmp_path: Path) -> None:
    """The marks a rank keeps are capped (MAX_MARKS); a new one still rewrites the record at
    once (the old check compared the list's length, which stops moving at the cap)."""
    writer = lineage.RecordWriter(tmp_path, "job-m", 0, 0, 1, interval=3600.0)
    full = [(step, float(step)) for step in range(gp.MAX_MARKS)]
    writer.keep(INC1, 1.0, full)
    wait_until(lambda: record_of(tmp_path), timeout=10, what="the first record")
    moved = [*full[1:], (gp.MAX_MARKS, 99.0)]
    writer.keep(INC1, 99.0, moved)
    wait_until(lambda: (record_of(tmp_path) or {}).get("goodput") == 99.0, timeout=10,
               what="the record with the newest mark")


def test_a_rank_keeps_its_record_and_its_successor_sends_the_handoff(tmp_path: Path) -> None:
    old = rg.RankAccount(0.0, Manager(tmp_path, 0), job="job-m")
    old.step(1.0, None)
    old.step(3.0, None)
    old.keep_record(INC1, force=True)  # the last datagram's
    record = record_of(tmp_path)
    assert record is not None and record["goodput"] == pytest.approx(2.0)
    assert (record["incarnation"], record["job"]) == (INC1, "job-m")

    began = time.perf_counter()  # a process that starts now, after the old one's last record
    new = rg.RankAccount(began, Manager(tmp_path, 0), job="job-m")
    sent = gp.parse(new.wire(began + 0.5))
    assert sent is not None and sent.previous is not None
    assert sent.previous.incarnation == INC1 and sent.previous.discarded is None
    assert sent.previous.goodput == pytest.approx(2.0)  # the old rank's kept progress
    assert 0.0 <= sent.previous.downtime < 60.0
    new.step(began + 1.0, None)  # its first step: resumed from nothing (-1), all 2 s discarded
    sent = gp.parse(new.wire(began + 1.0))
    assert sent is not None and sent.resumed == -1
    assert sent.previous is not None and sent.previous.discarded == pytest.approx(2.0)
    # another job that reuses the directory inherits nothing
    other = rg.RankAccount(began, Manager(tmp_path, 0), job="job-other")
    assert gp.parse(other.wire(began + 0.5)).previous is None  # type: ignore[union-attr]


def test_a_rank_without_a_checkpoint_manager_keeps_no_record(tmp_path: Path) -> None:
    account = rg.RankAccount(0.0, None)
    account.step(1.0, None)
    account.keep_record(INC1, force=True)
    assert gp.parse(account.wire(1.0)).previous is None  # type: ignore[union-attr]


@pytest.mark.parametrize("previous", [
    "x", {"incarnation": "not hex", "downtime": 1.0},
    {"incarnation": INC1, "downtime": float("nan")}, {"incarnation": INC1, "downtime": True},
    {"incarnation": INC1, "downtime": 1.0, "discarded": -1.0}, {"incarnation": "", "downtime": 1},
    {"incarnation": INC1, "downtime": 1.0, "goodput": float("inf")},
])
def test_a_bad_handoff_is_refused(previous: object) -> None:
    account = rg.RankAccount(0.0, None)
    account.step(1.0, None)
    wire = account.wire(1.0)
    wire["previous"] = previous
    with pytest.raises(ValueError):
        gp.parse(wire)
    message = {"v": 1, "job": "job-m", "rank": 0, "goodput": wire, "incarnation": INC1}
    with pytest.raises(WireError):
        decode(encode(message))


def test_a_negative_gap_is_counted_not_booked() -> None:
    """A handoff across two nodes' clocks that ran backwards: counted as negative."""
    c = gl.Ledger(zero_hold=0)
    c.ingest("job-m", INC2, 1, False,
             rank_report(0.5, 0.0, previous=gp.Handoff(INC1, -0.2, None)), 1030.5)
    totals = c.totals(["job-m"])["job-m"]
    assert totals["downtime"] == 0.0 and totals[gl.NEGATIVE] == 1
