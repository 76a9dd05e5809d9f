"""The node training exporter as a real process: metrics, control API validation, lifecycle.

A real TrainingMonitor (in this process, no torch) reports to it over the Unix socket, so the
job is known and the script-registered command type is advertised the way a rank does it.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.net import free_port, wait_until
from tests.training.support import EXPORTER, Exporter, exporter
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank.client import TrainingMonitor

JOB = "api-job"


class FakeOptimizer:
    """Only the attribute the monitor reads; no torch needed for API tests."""

    def __init__(self) -> None:
        self.param_groups = [{"lr": 0.1}]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Exporter, TrainingMonitor]]:
    workdir = tmp_path_factory.mktemp("exporter-api")
    with exporter(workdir) as exp:
        monitor = TrainingMonitor(
            rank_info=RankInfo(JOB, rank=1, local_rank=1, world_size=2, restarts=3),
            optimizer=FakeOptimizer(), socket_path=str(exp.socket), control=False,
            flush_interval=0.05)
        monitor.register_command("set_batch_size", lambda args, step: None, schema={
            "type": "object", "properties": {"batch_size": {"type": "integer", "minimum": 1}},
            "required": ["batch_size"], "additionalProperties": False})
        for step in range(5):
            monitor.report(step, loss=0.5 + step, grad_norm=2.0, samples=32, tokens=320,
                           data_wait=0.001, step_time=0.02)
        wait_until(lambda: exp.by_rank(catalog.TRAINING_STEP, JOB).get("1") == 4.0,
                   timeout=10, what="step 4 exported")
        yield exp, monitor
        monitor.close()


def test_metrics_carry_job_rank_node_labels_and_values(node: tuple[Exporter, TrainingMonitor]
                                                       ) -> None:
    exp, _ = node
    labels = (("node", "node-a"), ("rank", "1"), ("training_job", JOB))
    expected = {
        catalog.TRAINING_STEP: 4.0, catalog.TRAINING_LOSS: 4.5,
        catalog.TRAINING_LEARNING_RATE: 0.1, catalog.TRAINING_GRAD_NORM: 2.0,
        catalog.TRAINING_SAMPLES: 160.0, catalog.TRAINING_TOKENS: 1600.0,
        catalog.TRAINING_WORLD_SIZE: 2.0, catalog.TRAINING_RESTARTS: 3.0,
        catalog.TRAINING_DATA_WAIT: 0.001,
        catalog.TRAINING_DROPPED_SAMPLES: 0.0, catalog.TRAINING_STEP_DURATION + "_count": 5.0,
    }
    for name, value in expected.items():
        assert exp.samples(name, JOB) == {labels: pytest.approx(value)}, name
    assert exp.samples(catalog.TRAINING_LAST_STEP_TIMESTAMP, JOB)[labels] > 1.6e9
    bucket = exp.samples(catalog.TRAINING_STEP_DURATION + "_bucket", JOB)
    assert bucket[(("le", "0.025"), *labels)] == 5.0
    assert bucket[(("le", "0.01"), *labels)] == 0.0
    # CUDA figures are absent (not 0) on a CPU-only rank, and the non-finite loss counter
    # before the first one; no step number is ever a label.
    assert exp.samples(catalog.TRAINING_CUDA_MEM_ALLOCATED, JOB) == {}
    assert exp.samples(catalog.TRAINING_NONFINITE_LOSS, JOB) == {}
    # the job's newest step on this node, one series for all its ranks here
    node_labels = (("node", "node-a"), ("training_job", JOB))
    assert exp.samples(catalog.TRAINING_NODE_LAST_STEP_TIMESTAMP, JOB) == {
        node_labels: exp.samples(catalog.TRAINING_LAST_STEP_TIMESTAMP, JOB)[labels]}
    for family_labels in exp.samples(catalog.TRAINING_STEP, None):
        assert {k for k, _ in family_labels} == {"training_job", "rank", "node"}


def test_auth_is_required_and_compared_exactly(node: tuple[Exporter, TrainingMonitor]) -> None:
    exp, _ = node
    body = {"type": "scale_lr", "args": {"factor": 0.5}}
    for token in (None, "wrong-token-of-some-length", exp.token + "x", ""):
        response = exp.api("POST", f"/v1/jobs/{JOB}/commands", token=token, json=body)
        assert response.status_code == 401, token
        assert "token" in response.json()["error"]
    assert exp.api("GET", "/v1/jobs", token=None).status_code == 401
    assert exp.api("GET", f"/v1/jobs/{JOB}/commands").json() == {"commands": []}


@pytest.mark.parametrize(("body", "status", "fragment"), [
    ({"type": "explode"}, 400, "unknown command type"),
    ({"type": "scale_lr", "args": {"factor": 0}}, 400, "factor"),
    ({"type": "scale_lr", "args": {"factor": -0.5}}, 400, "factor"),
    ({"type": "scale_lr", "args": {"factor": 1.5}}, 400, "factor"),
    ({"type": "scale_lr", "args": {"factor": "0.5"}}, 400, "factor"),
    ({"type": "scale_lr", "args": {}}, 400, "factor"),
    ({"type": "scale_lr", "args": {"factor": 0.5, "rm": "-rf"}}, 400, "rm"),
    ({"type": "rollback", "args": {"skip_batches": -1}}, 400, "skip_batches"),
    ({"type": "set_batch_size", "args": {"batch_size": 0}}, 400, "batch_size"),
    ({"type": "scale_lr", "args": {"factor": 0.5}, "id": "../../etc"}, 400, "id"),
    ({"type": "scale_lr", "args": {"factor": 0.5}, "extra": 1}, 400, "unknown fields"),
    (["scale_lr"], 400, "JSON object"),
])
def test_bad_commands_get_a_clear_4xx_and_change_nothing(
        node: tuple[Exporter, TrainingMonitor], body: object, status: int, fragment: str) -> None:
    exp, _ = node
    response = exp.api("POST", f"/v1/jobs/{JOB}/commands", json=body)
    assert response.status_code == status
    assert fragment in response.json()["error"]
    assert exp.api("GET", f"/v1/jobs/{JOB}/commands").json() == {"commands": []}


@pytest.mark.parametrize("raw", [
    '{"type": "scale_lr", "args": {"factor": NaN}}',
    '{"type": "scale_lr", "args": {"factor": -Infinity}}',
    '{"type": "scale_lr", "args": {"factor": 0.5, "floor": Infinity}}',
    '{"type": "scale_lr", "args": {"factor": 0.5, "floor": 1e400}}',
    '{"type": "scale_lr", "args": {"factor": 0.5, "floor": 2}}',
    '{"type": "rollback", "args": {"skip_from_batch": 1152921504606846976}}',
    '{"type": "set_batch_size", "args": {"batch_size": NaN}}',
])
def test_non_finite_or_unbounded_command_arguments_are_400(
        node: tuple[Exporter, TrainingMonitor], raw: str) -> None:
    """Issue 25 item 5: Python's json accepts NaN/Infinity literals and a schema bound lets NaN
    through (every comparison is false). On the code before the fix `scale_lr` with factor
    NaN (or floor Infinity) answered 202 and every rank applied it."""
    exp, _ = node
    response = exp.api("POST", f"/v1/jobs/{JOB}/commands", data=raw,
                       headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert exp.api("GET", f"/v1/jobs/{JOB}/commands").json() == {"commands": []}


def test_unknown_job_bad_json_and_oversized_body(node: tuple[Exporter, TrainingMonitor]) -> None:
    exp, _ = node
    good = {"type": "scale_lr", "args": {"factor": 0.5}}
    response = exp.api("POST", "/v1/jobs/no-such-job/commands", json=good)
    assert response.status_code == 404 and "unknown job" in response.json()["error"]
    response = exp.api("POST", f"/v1/jobs/{JOB}/commands", data="{not json",
                       headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "JSON" in response.json()["error"]
    response = exp.api("POST", f"/v1/jobs/{JOB}/commands", data="[" * 16_000,  # too deep
                       headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "JSON" in response.json()["error"]
    response = exp.api("POST", f"/v1/jobs/{JOB}/commands", data="x" * 100_000)
    assert response.status_code == 413
    assert exp.api("GET", f"/v1/jobs/{JOB}/commands/nope").status_code == 404
    for rank in ("x", "\u00b2", "9" * 50):  # "²".isdigit() is True, int("²") is not
        assert exp.api("GET", f"/v1/jobs/{JOB}/commands?pending_for_rank={rank}"
                       ).status_code == 400
    assert exp.api("GET", f"/v1/jobs/{JOB}/commands").json() == {"commands": []}


def test_post_is_idempotent_by_id_and_lists_ranks(node: tuple[Exporter, TrainingMonitor]) -> None:
    exp, _ = node
    body = {"id": "alert-123", "type": "set_batch_size", "args": {"batch_size": 16}}
    first = exp.api("POST", f"/v1/jobs/{JOB}/commands", json=body)
    assert first.status_code == 202
    assert first.json()["ranks"] == {"1": {"status": "pending"}}
    again = exp.api("POST", f"/v1/jobs/{JOB}/commands", json=body)
    assert again.status_code == 200 and again.json()["id"] == "alert-123"
    clash = exp.api("POST", f"/v1/jobs/{JOB}/commands", json={**body, "args": {"batch_size": 8}})
    assert clash.status_code == 409
    listed = exp.api("GET", f"/v1/jobs/{JOB}/commands?pending_for_rank=1").json()["commands"]
    assert [c["id"] for c in listed] == ["alert-123"]
    assert exp.api("GET", f"/v1/jobs/{JOB}/commands/alert-123").json()["status"] == "pending"
    jobs = exp.api("GET", "/v1/jobs").json()["jobs"]
    assert jobs[0]["job"] == JOB and jobs[0]["world_size"] == 2
    assert "set_batch_size" in jobs[0]["ranks"]["1"]["command_types"]


def test_no_token_fails_closed_and_sigterm_exits_cleanly(tmp_path: Path) -> None:
    port = free_port()
    sock = tmp_path / "t.sock"
    proc = subprocess.Popen([str(EXPORTER), "--bind", "127.0.0.1", "--port", str(port),
                             "--socket", str(sock), "--node", "n"],
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        import requests

        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: requests.get(url + "/metrics", timeout=1).ok, timeout=20,
                   what="exporter without token")
        response = requests.get(url + "/v1/jobs", headers={"Authorization": "Bearer x"},
                                timeout=5)
        assert response.status_code == 503
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert not sock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        assert proc.stderr is not None
        proc.stderr.close()


@pytest.mark.parametrize("flags", [
    ["--port", "0"], ["--bind", "not-an-ip"], ["--socket", "/nonexistent-dir/x.sock"],
    ["--job-expiry-seconds", "0"], ["--token-file", "/nonexistent-token-file"],
])
def test_bad_flags_exit_nonzero_with_a_reason(tmp_path: Path, flags: list[str]) -> None:
    base = ["--bind", "127.0.0.1", "--port", str(free_port()), "--socket",
            str(tmp_path / "s.sock")]
    result = subprocess.run([str(EXPORTER), *base, *flags], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode != 0
    assert result.stderr.strip(), "a one-line reason on stderr"


def test_finished_jobs_expire(tmp_path: Path) -> None:
    with exporter(tmp_path, extra=("--job-expiry-seconds", "1")) as exp:
        monitor = TrainingMonitor(rank_info=RankInfo("short-job", 0, 0, 1, 0),
                                  socket_path=str(exp.socket), control=False,
                                  flush_interval=0.05)
        monitor.report(0, loss=1.0)
        monitor.close()
        wait_until(lambda: exp.samples(catalog.TRAINING_STEP, "short-job"), timeout=10,
                   what="job visible")
        wait_until(lambda: not exp.samples(catalog.TRAINING_STEP, "short-job"), timeout=10,
                   what="job expired")
        assert exp.api("GET", "/v1/jobs/short-job/commands").status_code == 404


def test_malformed_datagrams_are_counted_not_fatal(node: tuple[Exporter, TrainingMonitor]
                                                   ) -> None:
    import socket

    exp, _ = node
    before = exp.samples(catalog.TRAINING_EXPORTER_PREFIX + "malformed_datagrams_total")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        for payload in (b"garbage", json.dumps({"v": 1, "job": "../x"}).encode(),
                        json.dumps({"v": 1, "job": "j", "world_size": 1, "rank": 5}).encode(),
                        b"[" * 50_000):  # nesting deep enough to make json.loads recurse out
            sock.sendto(payload, str(exp.socket))
    wait_until(lambda: sum(exp.samples(catalog.TRAINING_EXPORTER_PREFIX
                                       + "malformed_datagrams_total").values())
               >= sum(before.values()) + 4, timeout=10, what="malformed counted")
    assert exp.api("GET", "/v1/jobs").status_code == 200
    assert exp.proc.alive()


def test_an_overlapping_restart_keeps_the_new_exporters_socket(tmp_path: Path) -> None:
    """A new exporter bound the socket path while the old one still ran (a restart that
    overlapped the old one's exit, or SIGHUP from a `reload`): the old one must leave the new
    one's socket file in place when it exits, and the new one keeps receiving."""
    with exporter(tmp_path, "old") as old, \
            exporter(tmp_path, "new", socket=old.socket) as new:
        old.proc.proc.send_signal(signal.SIGHUP)  # reload: the old process exits cleanly
        wait_until(lambda: not old.proc.alive(), timeout=20, what="old exporter exited")
        assert old.proc.proc.returncode is not None
        assert new.socket.exists()
        monitor = TrainingMonitor(rank_info=RankInfo("after-restart", 0, 0, 1, 0),
                                  socket_path=str(new.socket), control=False,
                                  flush_interval=0.05)
        try:
            step = 0

            def visible() -> bool:
                nonlocal step
                step += 1
                monitor.report(step, loss=1.0)
                return bool(new.samples(catalog.TRAINING_STEP, "after-restart"))

            wait_until(visible, timeout=20, what="datagrams received by the new exporter")
            assert new.socket.exists()
        finally:
            monitor.close()


def test_clients_that_never_finish_their_request_do_not_starve_scrapes(tmp_path: Path) -> None:
    """More clients than handler threads send half a request and stall: a scrape and a
    control call are still answered (trainwatch.exporters.contract.serving reads requests in its
    I/O loop;
    under
    gunicorn's gthread worker each such client held a handler thread until it timed out)."""
    with exporter(tmp_path, extra=("--threads", "2")) as exp:
        port = int(exp.url.rsplit(":", 1)[1])
        stalled: list[socket.socket] = []
        try:
            for _ in range(8):
                conn = socket.create_connection(("127.0.0.1", port), timeout=10)
                conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers never end
                stalled.append(conn)
            assert requests.get(exp.url + "/metrics", timeout=20).status_code == 200
            assert exp.api("GET", "/v1/jobs").status_code == 200
        finally:
            for conn in stalled:
                with contextlib.suppress(OSError):
                    conn.close()
