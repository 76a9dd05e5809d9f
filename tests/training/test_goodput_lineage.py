"""A job's slots across nodes (issue 37, shape 6): a restart that moves a slot to another node.

Each node's ledger counts the gap and the discarded work of a restart only for the slots whose
old rank it saw; a slot that moved is counted by its new node from the handoff its new rank
read from the old rank's record in the checkpoint directory (exporters/rank/lineage.py). The
real job on the Slurm test cluster is tests/slurm/test_goodput_moved.py; these pin the
arithmetic and the records.
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest

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


def test_without_a_handoff_the_node_counts_what_it_saw() -> None:
    """No checkpoint manager (no records): the node's own gap, as before."""
    a = gl.Ledger(zero_hold=0)
    a.ingest("job-m", INC1, 0, False, rank_report(20.0, 19.0), 1020.0)
    a.ingest("job-m", INC2, 0, False, rank_report(0.5, 0.0), 1030.5)
    assert a.totals(["job-m"])["job-m"]["downtime"] == pytest.approx(10.0)


def write_record(directory: Path, rank: int, incarnation: str, end: float, *,
                 host: str = "node-a", local_rank: int = 0, local_world: int = 1,
                 goodput: float = 19.0, marks: list[list[float]] | None = None) -> None:
    path = lineage.record_path(directory, rank)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"v": 1, "incarnation": incarnation, "host": host,
                                "local_rank": local_rank, "local_world": local_world,
                                "end": end, "goodput": goodput,
                                "marks": marks if marks is not None else [[10, 9.0]]}))


def test_the_predecessor_is_the_slot_record_of_rank_zeros_incarnation(tmp_path: Path) -> None:
    write_record(tmp_path, 0, INC2, 1100.0)
    write_record(tmp_path, 1, INC2, 1098.0, host="node-b", local_rank=0, local_world=2)
    write_record(tmp_path, 2, INC2, 1100.5, host="node-b", local_rank=1, local_world=2)
    write_record(tmp_path, 3, INC1, 1020.0)  # a slot inc2 did not have: stale
    one = lineage.read_predecessor(tmp_path, 1)
    assert one is not None and one.incarnation == INC2
    # its node-mate lived on to 1100.5 and its exporter closed both there: the gap starts there
    assert one.end == 1100.5
    assert one.handoff(1110.0) == {"incarnation": INC2, "downtime": pytest.approx(9.5),
                                   "discarded": None}
    assert one.discarded(10) == pytest.approx(10.0) and one.discarded(-1) == 19.0
    assert lineage.read_predecessor(tmp_path, 3) is None
    assert lineage.read_predecessor(tmp_path, 4) is None  # a new slot
    (tmp_path / "lineage" / "rank-2.json").write_text("{half")  # torn or foreign: ignored
    assert lineage.read_predecessor(tmp_path, 1).end == 1098.0  # type: ignore[union-attr]
    write_record(tmp_path, 1, INC2, 1098.0, local_rank=5, local_world=2)  # not a record
    assert lineage.read_predecessor(tmp_path, 1) is None
    assert lineage.read_predecessor(tmp_path / "absent", 0) is None


class Manager(SimpleNamespace):
    """Stands in for a CheckpointManager: its directory, rank, events and predecessor."""

    def __init__(self, directory: Path, rank: int) -> None:
        super().__init__(goodput_events=deque(maxlen=256), directory=directory, rank=rank,
                         predecessor=lineage.read_predecessor(directory, rank))


def test_a_rank_keeps_its_record_and_its_successor_sends_the_handoff(tmp_path: Path) -> None:
    old = rg.RankAccount(0.0, Manager(tmp_path, 0))
    old.step(1.0, None)
    old.step(3.0, None)
    old.keep_record(INC1)
    first = json.loads(lineage.record_path(tmp_path, 0).read_text())
    old.step(4.0, None)
    old.keep_record(INC1)  # within RECORD_SECONDS: not rewritten
    assert json.loads(lineage.record_path(tmp_path, 0).read_text()) == first
    old.keep_record(INC1, force=True)  # the last datagram's: always
    record = json.loads(lineage.record_path(tmp_path, 0).read_text())
    assert record["goodput"] == pytest.approx(3.0) and record["incarnation"] == INC1
    assert not list((tmp_path / "lineage").glob(".*.tmp"))

    began = time.perf_counter()  # a process that starts now, after the old one's last record
    new = rg.RankAccount(began, Manager(tmp_path, 0))
    sent = gp.parse(new.wire(began + 0.5))
    assert sent is not None and sent.previous is not None
    assert sent.previous.incarnation == INC1 and sent.previous.discarded is None
    assert 0.0 <= sent.previous.downtime < 60.0
    new.step(began + 1.0, None)  # its first step: resumed from nothing (-1), all 3 s discarded
    sent = gp.parse(new.wire(began + 1.0))
    assert sent is not None and sent.resumed == -1
    assert sent.previous is not None and sent.previous.discarded == pytest.approx(3.0)


def test_a_rank_without_a_checkpoint_manager_keeps_no_record(tmp_path: Path) -> None:
    account = rg.RankAccount(0.0, None)
    account.step(1.0, None)
    account.keep_record(INC1, force=True)
    assert gp.parse(account.wire(1.0)).previous is None  # type: ignore[union-attr]


@pytest.mark.parametrize("previous", [
    "x", {"incarnation": "not hex", "downtime": 1.0},
    {"incarnation": INC1, "downtime": float("nan")}, {"incarnation": INC1, "downtime": True},
    {"incarnation": INC1, "downtime": 1.0, "discarded": -1.0}, {"incarnation": "", "downtime": 1},
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
