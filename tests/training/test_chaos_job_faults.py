"""The chaos soak's job faults (benchmarks/chaos_job_faults.py) without the cluster: what the
injector writes is what examples/train_ddp.py's reader applies (once), the hosts shim sends a
training command for an inventory host to the loopback and refuses any other host, and the
heal judges (finite again; the loss back under the spike limit) need a run of steps, not one
lucky step."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests

from benchmarks import chaos_job_faults as faults
from tests.support.net import free_port

REPO = Path(__file__).resolve().parents[2]


def _reader(path: Path) -> Any:
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import train_ddp
    finally:
        sys.path.remove(str(REPO / "examples"))
    return train_ddp.FaultTrigger(str(path))


def test_what_the_injector_writes_the_example_applies_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "faults.json"
    monkeypatch.setenv(faults.FAULT_FILE_ENV, str(path))
    reader = _reader(path)
    soak: Any = SimpleNamespace()
    faults._write_fault(soak, "spike", "spike-1")
    assert reader.poll() == ("spike-1", "spike")
    assert reader.poll() is None
    faults._write_fault(soak, "nan", "nan-2")
    assert reader.poll() == ("nan-2", "nan")
    assert not (tmp_path / "faults.tmp").exists()  # written whole, then renamed


class _Echo(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        data = json.dumps({"path": self.path, "body": body.decode(),
                           "auth": self.headers.get("Authorization")}).encode()
        self.send_response(202)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def echo() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_the_hosts_shim_sends_an_inventory_host_to_the_loopback_only(echo: int) -> None:
    with faults.hosts_shim() as proxy:
        proxies = {"http": proxy}
        resp = requests.post(f"http://node-b:{echo}/v1/jobs/j/commands?x=1", json={"a": 1},
                             headers={"Authorization": "Bearer t"}, proxies=proxies,
                             timeout=10)
        assert resp.status_code == 202
        assert resp.json() == {"path": "/v1/jobs/j/commands?x=1", "body": '{"a": 1}',
                               "auth": "Bearer t"}
        other = requests.post(f"http://elsewhere.example:{echo}/", json={}, proxies=proxies,
                              timeout=10)
        assert other.status_code == 502


def _soak(tmp_path: Path, losses: list[float]) -> Any:
    out = tmp_path / "job.out"
    out.write_text("".join(json.dumps({"event": "step", "rank": i % 2, "step": i // 2,
                                       "loss": loss, "time": 100.0 + i}) + "\n"
                           for i, loss in enumerate(losses)))
    return SimpleNamespace(out=out)


def test_healed_needs_a_run_of_steps(tmp_path: Path) -> None:
    run = 2 * faults.HEALED_STEPS
    nan = float("nan")
    # one finite dip inside the NaN streak is not a heal; the run that starts at index 5 is
    soak = _soak(tmp_path, [nan, nan, 0.5, nan, nan] + [0.5] * run)
    assert faults._finite_after(soak, 0.0) == 105.0
    # a spike: 3.0 is over the limit 1.0; a dip under it is not a heal either
    soak = _soak(tmp_path, [3.0, 0.4, 3.0] + [0.7] * (run - 1))
    assert faults._back_under(soak, 0.0, 1.0) is None  # one step short of the run
    soak = _soak(tmp_path, [3.0, 0.4, 3.0] + [0.7] * run)
    assert faults._back_under(soak, 0.0, 1.0) == 103.0


def test_the_stopwatch_drops_the_steps_a_rollback_discarded() -> None:
    from benchmarks.chaos import stopwatch_ettr

    evs: list[dict[str, Any]] = [{"event": "incarnation", "time": 0.0}]
    for rank in (0, 1):  # steps 0..9 at 1 s each, a rollback to checkpoint 4 at 9.5 s,
        evs += [{"event": "step", "rank": rank, "step": s, "time": float(s)}
                for s in range(10)]  # then steps 5..9 again
        evs += [{"event": "step", "rank": rank, "step": s, "time": 5.0 + s}
                for s in range(5, 10)]
        evs.append({"event": "command_applied", "rank": rank, "type": "rollback",
                    "status": "applied", "result": {"restored_step": 4}, "time": 9.5})
    watch = stopwatch_ettr(evs, 0.0, 14.0)
    # before the rollback 9 s stepped (steps 1..9), steps 5..9 discarded: 4 s kept; after it
    # steps 5..9 again (5 s, the first timed from step 9's): 9 s kept of 14
    assert watch["productive_seconds"] == pytest.approx(14.0)
    assert watch["kept_seconds"] == pytest.approx(9.0)
