"""The training-side client without torch: launcher detection, never blocking, drop counting.

The exporter end is a plain Unix datagram socket the test binds itself, so it can stay
unread (a full socket, as when the exporter is stopped) or be read to check what arrived.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.net import wait_until
from trainwatch.exporters.contract import catalog, wire
from trainwatch.exporters.contract.launcher import RankInfo, detect
from trainwatch.exporters.rank.client import TrainingMonitor, _leave_at_exit

INFO = RankInfo("unit-job", rank=0, local_rank=0, world_size=1, restarts=0)


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, Path]]:
    path = tmp_path / "r.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    yield sock, path
    sock.close()


def read_all(sock: socket.socket) -> list[dict]:
    messages = []
    while True:
        try:
            messages.append(json.loads(sock.recv(1 << 17)))
        except BlockingIOError:
            return messages


@pytest.mark.parametrize(("env", "expected"), [
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RESTART_COUNT": "2",
      "TORCHELASTIC_RUN_ID": "elastic-run"}, RankInfo("elastic-run", 3, 1, 8, 2)),
    ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "6", "SLURM_JOB_ID": "991"},
     RankInfo("991", 5, 1, 6, 0)),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_SIZE": "4", "TRAINWATCH_JOB": "mpi-job"}, RankInfo("mpi-job", 2, 0, 4, 0)),
    ({}, RankInfo("default", 0, 0, 1, 0)),
    # torchrun inside a Slurm job that was requeued once (issue 23: the new incarnation is
    # told apart under the same job name): torchrun's own count starts from 0 again
    ({"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0",
      "SLURM_PROCID": "1", "SLURM_RESTART_COUNT": "1", "TRAINWATCH_JOB": "heal"},
     RankInfo("heal", 1, 0, 2, 1)),
])
def test_rank_info_comes_from_the_launcher(env: dict[str, str], expected: RankInfo) -> None:
    assert detect(env) == expected


def test_explicit_values_win_and_bad_names_are_refused() -> None:
    assert detect({"RANK": "1", "WORLD_SIZE": "2"}, job="x", rank=0).rank == 0
    for bad in ("../etc", "a b", "", "x" * 200):
        with pytest.raises(ValueError, match="job name"):
            detect({}, job=bad)
    with pytest.raises(ValueError, match="outside world size"):
        detect({"RANK": "4", "WORLD_SIZE": "2"})


def test_full_socket_drops_are_counted_and_reported_later(
        receiver: tuple[socket.socket, Path]) -> None:
    sock, path = receiver
    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(path), control=False,
                              flush_interval=60.0, buffer_size=100_000)
    for step in range(4000):  # 20 datagrams of 200 steps; the unread socket takes ~10
        monitor.report(step, loss=1.0, samples=1)
    monitor._shipper.wake.set()
    # The end state, not the first drop: every one of the 20 datagrams sent or dropped (the
    # shipper may still be sending when the first drop is counted; a loaded host shows it).
    shipper = monitor._shipper
    wait_until(lambda: shipper.datagrams_sent * 200 + monitor.stats()["dropped"] >= 4000,
               timeout=30,
               what="every datagram sent or dropped")
    dropped = monitor.stats()["dropped"]
    assert dropped > 0, "the unread socket filled up"
    assert dropped % 200 == 0 and dropped < 4000
    delivered = read_all(sock)
    assert sum(len(m["steps"]) for m in delivered) + dropped == 4000
    monitor.report(4000, loss=1.0)  # the next datagram that gets through carries the total
    monitor.close()
    last = read_all(sock)[-1]
    assert last["dropped"] == dropped and last["steps"][-1][0] == 4000


def test_absent_exporter_and_buffer_overflow_never_raise(tmp_path: Path) -> None:
    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(tmp_path / "absent.sock"),
                              control=False, flush_interval=60.0, buffer_size=10)
    for step in range(100):
        monitor.report(step, loss=float(step), lr=0.1, grad_norm=1.0)
    monitor.close()  # final flush: 90 lost to the bounded buffer, 10 to the absent socket
    assert monitor.stats()["dropped"] == 100
    assert monitor.stats()["reported"] == 100


def test_an_unreachable_exporter_is_named_once_on_the_log(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A job whose socket is absent says so once (where it looked, why, what to set), then
    only counts: one warning for many failed sends, none when the exporter comes up."""
    path = tmp_path / "later.sock"
    caplog.set_level("WARNING", logger="trainwatch.exporters.rank.shipper")
    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(path), control=False,
                              flush_interval=0.01)
    try:
        step = 0

        def lost_several() -> bool:
            nonlocal step
            monitor.report(step, loss=1.0)
            step += 1
            return monitor.stats()["dropped"] >= 5
        wait_until(lost_several, timeout=30, what="several failed sends")
        warnings = [r for r in caplog.records if r.name.endswith("shipper")]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        message = warnings[0].getMessage()
        assert str(path) in message and catalog.ENV_EXPORTER_SOCKET in message
        assert "No such file" in message
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(str(path))
            sock.settimeout(30)
            monitor.report(step, loss=1.0)
            assert json.loads(sock.recv(1 << 17))["job"] == INFO.job  # delivered once it exists
    finally:
        monitor.close()
    assert len([r for r in caplog.records if r.name.endswith("shipper")]) == 1


def test_nonfinite_loss_is_counted_and_shipped_at_once(
        receiver: tuple[socket.socket, Path]) -> None:
    sock, path = receiver
    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(path), control=False,
                              flush_interval=3600.0)
    read_all(sock)
    monitor.report(7, loss=float("nan"))
    assert monitor.stats()["nonfinite"] == 1
    message = wait_until(lambda: next(iter(read_all(sock)), None), timeout=5,
                         what="datagram shipped without waiting for the flush interval")
    assert message["nonfinite"] == 1 and math.isnan(message["steps"][0][3])
    monitor.report(8, loss=float("inf"))
    monitor.close()
    assert monitor.stats()["nonfinite"] == 2


def test_odd_values_do_not_raise_and_decode_cleanly(receiver: tuple[socket.socket, Path]
                                                    ) -> None:
    sock, path = receiver
    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(path), control=False,
                              flush_interval=60.0)
    monitor.report(1, loss="not a number", lr=object(), grad_norm=None)
    monitor.report(2, loss=3, lr=0.5, samples=8, tokens=80)
    monitor.close()
    messages = read_all(sock)
    reports = [wire.decode(json.dumps(m).encode()) for m in messages]
    steps = [s for r in reports for s in r.steps]
    assert steps[0][0] == 1 and steps[0][3] is None and steps[0][4] is None
    assert steps[1][3] == 3.0 and steps[1][4] == 0.5
    assert reports[-1].counters[catalog.TRAINING_SAMPLES] == 8
    assert reports[-1].counters[catalog.TRAINING_TOKENS] == 80


def test_custom_command_registration_is_validated(tmp_path: Path) -> None:
    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(tmp_path / "x.sock"),
                              control=False)
    try:
        with pytest.raises(ValueError, match="built-in"):
            monitor.register_command("scale_lr", lambda a, s: None)
        with pytest.raises(ValueError, match="must match"):
            monitor.register_command("Bad Name", lambda a, s: None)
        with pytest.raises(Exception, match="is not valid"):
            monitor.register_command("ok_name", lambda a, s: None, schema={"type": 12})
    finally:
        monitor.close()


@pytest.mark.parametrize("payload", [
    b"", b"[]", b'{"v": 2}', b'{"v": 1, "job": "a/b", "world_size": 1}',
    b'{"v": 1, "job": "j", "world_size": 1, "steps": [[-1, 0, 0, 0, 0, 0, 0]]}',
    b'{"v": 1, "job": "j", "world_size": 1, "applied": [{"id": "x", "type": "t", '
    b'"status": "maybe", "step": 1}]}',
])
def test_wire_rejects_off_contract_datagrams(payload: bytes) -> None:
    with pytest.raises(wire.WireError):
        wire.decode(payload)


def test_bad_sync_period_is_refused_with_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("TRAINWATCH_SYNC_EVERY", "ten")
    with pytest.raises(ValueError, match="TRAINWATCH_SYNC_EVERY"):
        TrainingMonitor(rank_info=INFO, socket_path=str(tmp_path / "x.sock"), control=False)
    with pytest.raises(ValueError, match="sync_every"):
        TrainingMonitor(rank_info=INFO, socket_path=str(tmp_path / "x.sock"), control=False,
                        sync_every=-1)


def test_a_non_finite_command_is_reported_failed_and_the_lr_is_untouched(
        receiver: tuple[socket.socket, Path]) -> None:
    """Issue 25 item 5, the client that applies commands: a `scale_lr` with factor NaN that
    reaches a rank (from its exporter's poll or a peer rank, through the same queue) fails
    there. On the code before the fix every rank applied it and the LR became NaN."""
    class Optimizer:
        param_groups = [{"lr": 0.1}]

    _, path = receiver
    optimizer = Optimizer()
    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(path), control=False,
                              optimizer=optimizer, flush_interval=60.0)
    try:
        for number, factor in enumerate((math.nan, math.inf, 0.5)):
            monitor._incoming.append({"id": f"c{number}", "type": "scale_lr",
                                      "args": {"factor": factor}})
        control = monitor.step_end(0)
        statuses = {e["id"]: e["status"] for e in control.applied}
        assert statuses == {"c0": "failed", "c1": "failed", "c2": "applied"}
        assert optimizer.param_groups[0]["lr"] == 0.05
    finally:
        monitor.close()


def test_sigterm_during_the_exit_close_waits_for_its_last_datagram(
        receiver: tuple[socket.socket, Path]) -> None:
    """A rank that raised closes its monitor at exit; torchrun's SIGTERM can land while that
    close's last datagram is still being sent. The SIGTERM goodbye must wait for it (within
    its timeout), not find the monitor closed and let the process die first: the rank then
    reads as the one that was killed (a whole-suite run lost rank 1's word that way). The
    last send is made slow here: it waits for a gate that opens a second later."""
    sock, path = receiver
    monitor = TrainingMonitor(rank_info=INFO, socket_path=str(path), control=False,
                              flush_interval=0.05)
    shipper = monitor._shipper
    gate = threading.Event()
    flush = shipper._flush

    def slow_last_flush(force: bool = False) -> None:
        if force:
            gate.wait(30)
        flush(force=force)

    shipper._flush = slow_last_flush  # type: ignore[method-assign]
    monitor.report(1, loss=0.5, step_time=0.1)
    closer = threading.Thread(target=monitor.close, kwargs={"timeout": 30, "finished": False})
    closer.start()
    wait_until(lambda: monitor._closed, timeout=10, what="the exit close begun")
    threading.Timer(1.0, gate.set).start()  # the slow send, not a synchronisation
    _leave_at_exit(weakref.ref(monitor), timeout=30)  # the SIGTERM goodbye
    assert any(m.get("exiting") for m in read_all(sock)), "the goodbye returned first"
    closer.join(30)
