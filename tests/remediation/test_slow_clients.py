"""Issue 11 item 4: slow or idle connections must not starve intake or health checks
(real remediation-server process, real sockets). Latency numbers are measured by
benchmarks/webhook.py (tests assert no timings); here every request must simply be answered
while 64 slow connections stay open, where the old front (gunicorn gthread, 8 threads) answered
none until they closed."""

from __future__ import annotations

import socket
from contextlib import ExitStack
from pathlib import Path

import requests

from tests.remediation.helpers import alert, auth, payload
from tests.remediation.processes import running_service
from tests.support.net import wait_until

BOOK = {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
        "target": ["training_job"], "dry_run": True,
        "steps": [{"action": "http", "url": "http://127.0.0.1:1/x"}]}
PARTIAL = {
    "idle": b"",
    "slow_headers": b"POST /v1/alerts HTTP/1.1\r\nHost: remediation\r\nContent-Ty",
    "slow_body": (b"POST /v1/alerts HTTP/1.1\r\nHost: remediation\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 5000\r\n\r\n{\"version\": \"4\", "),
}


def _open(stack: ExitStack, port: int, kind: str) -> socket.socket:
    sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=10))
    if PARTIAL[kind]:
        sock.sendall(PARTIAL[kind])
    return sock


def test_64_slow_connections_leave_intake_and_readyz_answering(tmp_path: Path) -> None:
    with running_service(tmp_path, [BOOK]) as svc, ExitStack() as stack:
        port = int(svc.url.rsplit(":", 1)[1])
        kinds = list(PARTIAL)
        for n in range(64):
            _open(stack, port, kinds[n % len(kinds)])
        session = requests.Session()
        for n in range(20):
            ready = session.get(f"{svc.url}/readyz", timeout=10)
            assert ready.status_code == 200, ready.text
            body = payload(alert("TrainingLossSpike", {"training_job": f"j{n}"}))
            answer = session.post(f"{svc.url}/v1/alerts", json=body, timeout=10, headers=auth())
            assert answer.status_code == 200 and answer.json()["accepted"] == 1


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_a_request_that_does_not_arrive_in_time_is_cut_off(tmp_path: Path) -> None:
    """Header and body read deadline (request_timeout_seconds), and idle connections close
    after idle_timeout_seconds: a slow client holds a socket for a bounded time only."""
    with running_service(tmp_path, [BOOK], request_timeout_seconds=1.0,
                         idle_timeout_seconds=2.0) as svc, ExitStack() as stack:
        port = int(svc.url.rsplit(":", 1)[1])
        socks = {kind: _open(stack, port, kind) for kind in PARTIAL}
        for sock in socks.values():
            sock.settimeout(0.2)
        for kind, sock in socks.items():
            wait_until(lambda sock=sock: _closed(sock), timeout=30,
                       what=f"the server to close the {kind} connection")
