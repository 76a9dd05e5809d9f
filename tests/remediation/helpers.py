"""Builders and real loopback HTTP stand-ins for the remediation tests."""

from __future__ import annotations

import hashlib
import json
import secrets
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
TOKEN = "test-webhook-token-" + "a" * 16
CONTROL_TOKEN = "test-control-token-" + "b" * 16
# approver credentials (trainwatch.remediation.approvers): name -> token; the file holds only
# digests
APPROVERS = {"alice": "approver-alice-" + "c" * 24, "bob": "approver-bob-" + "d" * 24}


def alert(alertname: str, labels: dict[str, str] | None = None, *, fingerprint: str = "",
          status: str = "firing", starts_at: str = "2026-11-21T18:03:15.119Z") -> dict[str, Any]:
    labels = {"alertname": alertname, "severity": "warning", **(labels or {})}
    fingerprint = fingerprint or secrets.token_hex(8)
    return {"status": status, "labels": labels, "annotations": {"summary": "test"},
            "startsAt": starts_at,
            "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-21T19:00:00Z",
            "generatorURL": "http://prometheus/graph", "fingerprint": fingerprint}


def payload(*alerts: dict[str, Any], truncated: int = 0) -> dict[str, Any]:
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return {"receiver": "remediation", "status": status, "alerts": list(alerts),
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093", "version": "4", "groupKey": "{}:{}",
            "truncatedAlerts": truncated}


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


ANSIBLE_PLAYBOOKS = Path(__file__).resolve().parents[2] / "ansible" / "playbooks" / "remediation"


def write_config(workdir: Path, **overrides: Any) -> Path:
    """A complete service config in `workdir` with token files mode 0600."""
    workdir.mkdir(parents=True, exist_ok=True)
    token_file = workdir / "webhook.token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    control = workdir / "control.token"
    control.write_text(CONTROL_TOKEN)
    control.chmod(0o600)
    approvers = workdir / "approvers"
    approvers.write_text("".join(f"{name} sha256:{hashlib.sha256(tok.encode()).hexdigest()}\n"
                                 for name, tok in APPROVERS.items()))
    config = {
        "bind": "127.0.0.1",
        "port": 1,
        "webhook_token_file": str(token_file),
        "store_path": str(workdir / "remediation.sqlite"),
        "prometheus_url": "http://127.0.0.1:1",
        "alertmanager_url": "http://127.0.0.1:1",
        "training_exporter_token_file": str(control),
        "approvers_file": str(approvers),
        # the collection's source: the service's default is an installed collection
        "ansible_playbooks_dir": str(ANSIBLE_PLAYBOOKS),
        "poll_interval_seconds": 0.05,
        "retry_backoff_seconds": 0.2,
        **overrides,
    }
    path = workdir / "remediation.yml"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def write_playbook(directory: Path, doc: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class StubState:
    """What a stand-in server saw; `gate` (if set) blocks POST handlers whose path starts with
    `gate_prefix` until released; POSTs under `fail_prefix` are answered 500."""

    requests: list[Recorded] = field(default_factory=list)
    gate: threading.Event | None = None
    gate_prefix: str = "/"
    fail_prefix: str | None = None
    metrics_text: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def posts(self, prefix: str = "/") -> list[Recorded]:
        with self.lock:
            return [r for r in self.requests if r.method == "POST" and r.path.startswith(prefix)]


class _Handler(BaseHTTPRequestHandler):
    state: StubState

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: Any, ctype: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._reply(200, self.state.metrics_text, "text/plain; version=0.0.4")
        else:
            self._reply(200, {"ok": True})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        with self.state.lock:
            self.state.requests.append(Recorded("POST", self.path, dict(self.headers), body))
        if self.state.gate is not None and self.path.startswith(self.state.gate_prefix):
            self.state.gate.wait(60)
        failing = self.state.fail_prefix and self.path.startswith(self.state.fail_prefix)
        self._reply(500 if failing else 200, {"ok": not failing})


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served by a real HTTP server on a free loopback port ("127.0.0.1:port"),
    stopped and joined on the way out."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextmanager
def stub_server(state: StubState | None = None) -> Iterator[tuple[str, StubState]]:
    """A real HTTP server on a free loopback port that records what it receives: the stand-in
    for a pager or an arbitrary `http` action target (external services)."""
    state = state or StubState()
    handler = type("Handler", (_Handler,), {"state": state})
    with serving(handler) as address:
        try:
            yield address, state
        finally:
            if state.gate is not None:
                state.gate.set()
