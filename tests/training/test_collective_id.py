"""Issue 28 point 7: the collective a rank is inside is told on every process group, not only
the default one (flight recorder entries as torch 2.13 writes them; the real recorder is
read in tests/training/test_sync.py and the real 4-rank jobs of test_hang_kinds.py)."""

from __future__ import annotations

from typing import Any

from exporters.training.collectives import collective_key, summarise


def entry(group: str, seq: int, op: str = "gloo:all_reduce", *, retired: bool = True,
          created: int = 1_700_000_000_000_000_000) -> dict[str, Any]:
    return {"process_group": [group, "desc"], "collective_seq_id": seq, "profiling_name": op,
            "retired": retired, "time_created_ns": created, "is_p2p": False}


DONE = [entry("0", 1), entry("0", 2), entry("1", 1)]


def test_peers_waiting_on_another_group_are_told_from_a_rank_outside_any() -> None:
    waiting = summarise([*DONE, entry("1", 2, retired=False)])
    outside = summarise(DONE)
    assert waiting[0] == outside[0] == 2, "the default group's sequence is equal"
    assert waiting[1] is not None and outside[1] is None
    assert waiting[2] == collective_key("1", 2, "gloo:all_reduce") != 0
    assert outside[2] == 0


def test_another_collective_at_the_same_place_has_another_id() -> None:
    peers = summarise([*DONE, entry("1", 2, retired=False)])
    other_op = summarise([*DONE, entry("1", 2, "gloo:broadcast", retired=False)])
    other_group = summarise([*DONE, entry("2", 1, retired=False)])
    assert len({peers[2], other_op[2], other_group[2]}) == 3


def test_the_oldest_collective_in_flight_names_it() -> None:
    both = summarise([*DONE, entry("0", 3, retired=False, created=5),
                      entry("1", 2, retired=False, created=9)])
    assert both[1] == 5 / 1e9 and both[2] == collective_key("0", 3, "gloo:all_reduce")
