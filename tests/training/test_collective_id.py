"""Issue 28 point 7: the collective a rank is inside is told on every process group, not only
the default one (flight recorder entries as torch 2.13 writes them; the real recorder is
read in tests/training/test_sync.py and the real 4-rank jobs of test_hang_kinds.py)."""

from __future__ import annotations

from typing import Any

import pytest

from trainwatch.exporters.rank.collectives import collective_key, summarise


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

    from trainwatch.exporters.rank.collectives import OwnCompute

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

    from trainwatch.exporters.contract import catalog
    from trainwatch.exporters.contract.wire import decode
    from trainwatch.exporters.node.training.collector import TrainingCollector
    from trainwatch.exporters.node.training.store import COMPUTE_WINDOW_SECONDS, Store

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
    """The stalled-job diagnostics (trainwatch.exporters.node.tools.stack_dump) say the same as the
    alert:
    peers wait on group 1, rank 2 is inside nothing; the default group's sequence numbers are
    equal, so `not_entered` cannot tell."""
    from trainwatch.exporters.node.tools.stack_dump import analyse, summarise_recorder

    def proc(rank: str, waiting: bool) -> dict[str, Any]:
        entries = [*DONE, *([entry("1", 2, retired=False)] if waiting else [])]
        return {"rank": rank, "flight_recorder": summarise_recorder({"entries": entries})}

    report = analyse([proc("0", True), proc("1", True), proc("2", False), proc("3", True)])
    assert report["elsewhere"] == ["2"]
    assert report["not_entered"] == []
    even = analyse([proc("0", True), proc("1", False)])
    assert even["elsewhere"] == [], "an even split names nobody"


SIGTERM_RANK = """
import signal, sys, threading, time
from trainwatch.exporters.rank.client import TrainingMonitor
from trainwatch.exporters.contract.launcher import RankInfo
monitor = TrainingMonitor(rank_info=RankInfo("bye", rank=0, local_rank=0, world_size=1,
                                             restarts=0),
                          socket_path=sys.argv[1], control=False, flush_interval=0.05)
monitor.report(0, loss=1.0)
if sys.argv[2] == "own-handler":  # a framework's graceful shutdown, installed afterwards
    signal.signal(signal.SIGTERM, lambda *a: (print("own handler", flush=True), sys.exit(3)))
if sys.argv[2] == "forked-child":  # a DataLoader worker, stopped with SIGTERM
    import os
    child = os.fork()
    if child == 0:
        os.kill(os.getpid(), signal.SIGTERM)
        os._exit(0)
    os.waitpid(child, 0)
    time.sleep(2)  # the parent's watcher would have acted by now
    print("parent alive", flush=True)
    monitor.close()
    sys.exit(0)
print("ready", flush=True)
if sys.argv[2] == "own-handler":
    time.sleep(60)
else:
    threading.Event().wait()  # the main thread blocked, as in a collective
"""


@pytest.mark.parametrize("mode", ["blocked", "own-handler", "forked-child"])
def test_sigterm_sends_a_last_datagram_and_still_kills_or_leaves_a_later_handler_alone(
        tmp_path, mode: str) -> None:
    """Issue 28 point 7: a rank stopped with SIGTERM (torchrun stopping the peers of a killed
    rank) says so in a last datagram, then dies of SIGTERM as before (-15); a SIGTERM handler
    the script installed afterwards is left to decide (no datagram from us, its exit code); a
    forked child's SIGTERM (a DataLoader worker stopped) does not end the rank."""
    import signal
    import socket
    import subprocess
    import sys

    from tests.support.net import wait_until
    from trainwatch.exporters.contract.wire import decode

    path = tmp_path / "exporter.sock"
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(str(path))
    sink.settimeout(0.2)
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_RANK, str(path), mode],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        if mode == "forked-child":
            assert proc.stdout.readline().strip() == "parent alive"
        else:
            assert proc.stdout.readline().strip() == "ready"
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        reports = []

        def drained() -> bool:
            try:
                reports.append(decode(sink.recv(65536)))
            except TimeoutError:
                return True
            return False

        wait_until(drained, timeout=30, what="datagrams read")
    finally:
        proc.kill()
        proc.wait()
        sink.close()
    if mode == "blocked":
        assert code == -signal.SIGTERM
        assert reports[-1].exiting and not reports[-1].finished
    elif mode == "forked-child":  # the child's SIGTERM is not the rank's: a clean finish
        assert code == 0 and reports[-1].finished and not reports[-1].exiting
    else:
        assert code == 3, "the script's own handler ran"
        assert not any(r.exiting and not r.finished for r in reports[:-1])
