"""The exporter's membership and liveness bookkeeping, with a fake clock (no processes)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainwatch.exporters.contract.wire import RankReport, WireError, decode
from trainwatch.exporters.node.training.store import Store

BASE: dict[str, Any] = {"v": 1, "job": "j", "rank": 0, "world_size": 4}


def report(rank: int, world: int, incarnation: str, restarts: int = 0,
           applied: list[dict] | None = None) -> RankReport:
    return decode(json.dumps({**BASE, "rank": rank, "world_size": world, "restarts": restarts,
                              "incarnation": incarnation, "applied": applied or [],
                              "collective": [7, None, "agreement"]}).encode())


@pytest.mark.parametrize("field,value", [
    ("incarnation", "NOT-HEX"), ("incarnation", 5), ("incarnation", "a" * 33),
    ("finished", "yes"), ("collective", [1, None]), ("collective", [1, None, "other"]),
    ("collective", [-1, None, "agreement"]), ("collective", [1, -5.0, "agreement"]),
    ("collective", [1, float("inf"), "agreement"]), ("exiting", 1), ("collective_key", -1),
    ("collective_key", 2**33), ("collective_key", 1.5),
])
def test_bad_liveness_fields_are_refused(field: str, value: Any) -> None:
    with pytest.raises(WireError):
        decode(json.dumps({**BASE, field: value}).encode())


def test_good_liveness_fields_are_read() -> None:
    parsed = decode(json.dumps({**BASE, "incarnation": "ab12", "finished": True,
                                "collective": [3, 1700000000.5, "flight_recorder"]}).encode())
    assert (parsed.incarnation, parsed.finished) == ("ab12", True)
    assert (parsed.collective_seq, parsed.collective_since, parsed.collective_source) == (
        3, 1700000000.5, "flight_recorder")


def test_a_new_launch_replaces_the_rank_set_and_old_datagrams_are_ignored() -> None:
    store = Store(600, clock=lambda: 100.0, wall=lambda: 1000.0)
    for rank in range(4):
        store.ingest(report(rank, 4, "aaaa"))
    code, posted = store.post_command("j", {"id": "c1", "type": "checkpoint"})
    assert code == 202 and set(posted["ranks"]) == {"0", "1", "2", "3"}
    done = {"id": "c1", "type": "checkpoint", "args": {}, "status": "applied", "step": 5}
    store.ingest(report(0, 2, "bbbb", applied=[done]))
    assert set(store.snapshot()["j"]) == {0}, "departed ranks gone at the first datagram"
    store.ingest(report(3, 4, "aaaa"))  # a departed rank's late datagram
    store.ingest(report(1, 2, "bbbb", applied=[done]))
    assert set(store.snapshot()["j"]) == {0, 1}
    described = store.get_command("j", "c1")
    assert described["status"] == "applied" and set(described["ranks"]) == {"0", "1"}
    assert store.list_jobs()[0]["incarnation"] == "bbbb"
    state = store.snapshot()["j"][0]
    assert (state.heartbeat, state.collective_seq, state.collective_since) == (1000.0, 7, None)


def test_reports_without_incarnation_keep_the_old_behaviour() -> None:
    store = Store(600, clock=lambda: 1.0)
    store.ingest(decode(json.dumps({**BASE, "rank": 3}).encode()))
    store.ingest(decode(json.dumps({**BASE, "rank": 0}).encode()))
    assert set(store.snapshot()["j"]) == {0, 3}


def test_ranks_without_a_process_group_agree_on_their_launch_id(tmp_path) -> None:
    """Monitors made before init_process_group (or ranks that never form a group) cannot
    broadcast rank 0's launch id: each rank derives the same one from its launch, so the
    exporter does not take every rank for a new launch and drop the others (a loss series
    that came and went, and no alert on it). A restart or another world size is another id."""
    from trainwatch.exporters.contract.launcher import RankInfo
    from trainwatch.exporters.rank.client import TrainingMonitor

    def incarnation(rank: int, world: int = 2, restarts: int = 0) -> str:
        info = RankInfo("nogroup", rank=rank, local_rank=rank, world_size=world,
                        restarts=restarts)
        monitor = TrainingMonitor(rank_info=info, control=False,
                                  socket_path=str(tmp_path / "absent.sock"))
        try:
            return monitor.incarnation
        finally:
            monitor.close()

    assert incarnation(0) == incarnation(1)
    assert incarnation(0, restarts=1) != incarnation(0)
    assert incarnation(0, world=4) != incarnation(0)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def finished(rank: int, world: int, incarnation: str) -> RankReport:
    return decode(json.dumps({**BASE, "rank": rank, "world_size": world, "finished": True,
                              "incarnation": incarnation}).encode())


def test_a_finished_job_refuses_commands_and_its_pending_ones_are_not_inherited(
        tmp_path) -> None:
    """Issue 28 point 3: once every rank reported a clean end, a command is refused (409,
    with the reason); one accepted before and not applied is closed ("cancelled"), durably,
    and offered to no rank of the next launch of the same name. Old code: 202, and the next
    launch got both commands at its first poll."""
    from trainwatch.exporters.node.training.command_log import CommandLog
    from trainwatch.exporters.node.training.store import ApiError

    log = CommandLog(tmp_path / "commands.db")
    store = Store(600, clock=Clock())
    store.attach_log(log)
    for rank in range(2):
        store.ingest(report(rank, 2, "aaaa"))
    assert store.post_command("j", {"id": "early", "type": "checkpoint"})[0] == 202
    store.ingest(finished(0, 2, "aaaa"))
    assert store.get_command("j", "early")["status"] == "pending", "one rank still runs"
    store.ingest(finished(1, 2, "aaaa"))
    early = store.get_command("j", "early")
    assert early["status"] == "cancelled" and "finished" in early["reason"]
    with pytest.raises(ApiError) as refused:
        store.post_command("j", {"id": "late", "type": "scale_lr", "args": {"factor": 0.5}})
    assert refused.value.status == 409 and "finished" in refused.value.message
    # a re-delivery of the accepted one is still answered with what became of it
    assert store.post_command("j", {"id": "early", "type": "checkpoint"})[1]["status"] == \
        "cancelled"
    store.ingest(report(0, 2, "bbbb"))  # the next launch of the name
    assert store.list_commands("j", pending_for_rank=0) == []
    # after an exporter restart too (the command log keeps the closing)
    again = Store(600, clock=Clock())
    again.attach_log(log)
    again.ingest(report(0, 2, "cccc"))
    assert again.list_commands("j", pending_for_rank=0) == []
    assert again.get_command("j", "early")["status"] == "cancelled"
    posted = again.post_command("j", {"id": "new", "type": "checkpoint"})
    assert posted[0] == 202 and [c["id"] for c in again.list_commands("j", 0)] == ["new"]
    log.close()


def test_a_rank_whose_datagrams_stopped_leaves_the_members_a_command_waits_for() -> None:
    """Issue 28 point 4: a departed rank (no datagram for `departed_after`) is no member of
    the command; an exporter whose ranks all departed (the ghost of a scale-down) answers
    "departed" instead of "pending" until the job expires. Old code: pending for 600 s."""
    clock = Clock()
    live = Store(600, clock=clock, departed_after=30)
    ghost = Store(600, clock=clock, departed_after=30)
    for rank in (0, 1):
        live.ingest(report(rank, 4, "aaaa"))
    for rank in (2, 3):
        ghost.ingest(report(rank, 4, "aaaa"))
    clock.now += 20
    live.ingest(report(0, 4, "aaaa"))  # rank 1 stopped at t=100; rank 0 goes on
    for store in (live, ghost):
        assert store.post_command("j", {"id": "c1", "type": "checkpoint"})[0] == 202
    assert ghost.get_command("j", "c1")["status"] == "pending", "not yet departed"
    clock.now += 15  # rank 1, 2, 3 silent 35 s; rank 0 15 s
    done = {"id": "c1", "type": "checkpoint", "args": {}, "status": "applied", "step": 5}
    live.ingest(report(0, 4, "aaaa", applied=[done]))
    described = live.get_command("j", "c1")
    assert described["status"] == "applied"
    assert described["ranks"] == {"0": {"status": "applied", "step": 5},
                                  "1": {"status": "departed"}}
    gone = ghost.get_command("j", "c1")
    assert gone["status"] == "departed"
    assert gone["ranks"] == {"2": {"status": "departed"}, "3": {"status": "departed"}}
    live.ingest(report(1, 4, "aaaa"))  # a rank that speaks again is a member again
    assert live.get_command("j", "c1")["status"] == "partial"
