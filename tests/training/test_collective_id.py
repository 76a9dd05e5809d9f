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


def test_own_compute_is_the_time_before_entering_the_steps_last_collective() -> None:
    """Issue 28 point 6: step k's own compute runs from report k-1 to the rank's entry into
    step k's last collective; the rest is waiting (recorder entries as torch 2.13 writes
    them; tests/training/test_straggler.py reads the real recorder)."""
    import json

    from exporters.training.collectives import OwnCompute

    base = 1_700_000_000.0
    # reports at 0, 1, 2, 3 s; entries: step 1 enters at 0.2 (agreement) and 0.7, step 2 at
    # 1.9, step 3 has none
    created = [0.2, 0.7, 1.9]
    entries = [entry("0", i + 1, created=int((base + t) * 1e9)) for i, t in enumerate(created)]

    def recorder(**_: Any) -> str:
        return json.dumps({"entries": entries})

    compute = OwnCompute(recorder)
    for t in (0.0, 1.0, 2.0, 3.0):
        compute.note_report(base + t)
    compute.measure(force=True)
    assert compute.steps == 2 and abs(compute.seconds - (0.7 + 0.9)) < 1e-6
    assert OwnCompute(None).steps == 0, "without the recorder nothing is measured"


def test_the_exporter_serves_each_ranks_mean_over_the_window_and_the_nodes_slowest() -> None:
    import json as _json

    from exporters import catalog
    from exporters.training.collector import TrainingCollector
    from exporters.training.store import COMPUTE_WINDOW_SECONDS, Store
    from exporters.training.wire import decode

    now = [100.0]
    store = Store(600, clock=lambda: now[0])

    def send(rank: int, seconds: float, steps: int) -> None:
        store.ingest(decode(_json.dumps({"v": 1, "job": "j", "rank": rank, "world_size": 4,
                                         "compute": [seconds, steps]}).encode()))

    ranks = ((0, 0.1), (1, 0.1), (2, 0.12), (3, 0.1))
    for rank, _ in ranks:
        send(rank, 50.0, 100)  # an old period (0.5 s per step): out of the mean later
    now[0] += 10
    for rank, _ in ranks:
        send(rank, 60.0, 200)  # the window's start...
    now[0] += COMPUTE_WINDOW_SECONDS
    for rank, per_step in ranks:
        send(rank, 60.0 + 100 * per_step, 300)  # ...and the newest, a window later
    scraped = {s.name: (s.labels, s.value) for f in TrainingCollector(store, "n1").collect()
               for s in f.samples if s.name.startswith("training_node_compute")}
    assert scraped[catalog.TRAINING_NODE_COMPUTE_SLOWEST][0]["rank"] == "2"
    assert abs(scraped[catalog.TRAINING_NODE_COMPUTE_SLOWEST][1] - 0.12) < 1e-9
    assert abs(scraped[catalog.TRAINING_NODE_COMPUTE_MEDIAN][1] - 0.1) < 1e-9
    assert scraped[catalog.TRAINING_NODE_COMPUTE_RANKS][1] == 4


def test_the_diagnostics_name_the_rank_inside_another_collective_on_any_group() -> None:
    """The stalled-job diagnostics (remediation.tools.stack_dump) say the same as the alert:
    peers wait on group 1, rank 2 is inside nothing; the default group's sequence numbers are
    equal, so `not_entered` cannot tell."""
    from remediation.tools.stack_dump import analyse, summarise_recorder

    def proc(rank: str, waiting: bool) -> dict[str, Any]:
        entries = [*DONE, *([entry("1", 2, retired=False)] if waiting else [])]
        return {"rank": rank, "flight_recorder": summarise_recorder({"entries": entries})}

    report = analyse([proc("0", True), proc("1", True), proc("2", False), proc("3", True)])
    assert report["elsewhere"] == ["2"]
    assert report["not_entered"] == []
    even = analyse([proc("0", True), proc("1", False)])
    assert even["elsewhere"] == [], "an even split names nobody"
