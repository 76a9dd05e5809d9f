"""The command socket: where a rank reads its job's commands, as the kernel says it is.

A Unix stream socket beside the report socket (catalog.command_socket). A rank connects,
writes one JSON line `{"job": <name>, "rank": <n>}` and reads one JSON document back, then
the connection closes:

    {"commands": [...]}                       the job's commands this rank has not applied
    {"error": "...", "status": 403}           the caller is not a process of that job

The caller's identity is the connection's SO_PEERCRED (senders.py), matched against the
identity the job's reports bound the name to (Store.pending_for): no token is involved, so no
rank holds a credential that would let it read or post another job's commands. Posting stays
on the HTTP control API, behind the remediation service's token.

Each connection is served on a thread of its own for at most CONNECTION_SECONDS, and at most
MAX_CONNECTIONS at once (a local process that opens connections and sends nothing costs a
socket and a waiting thread until then, never the answers to the others for long).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
import stat
import threading
from pathlib import Path
from typing import Any

from trainwatch.exporters.node.training.senders import RefusalLog, Resolver
from trainwatch.exporters.node.training.store import NotOwner, Store

log = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 4096
MAX_CONNECTIONS = 64
CONNECTION_SECONDS = 2.0


def _answer(conn: socket.socket, body: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the rank went away; it polls again
        conn.sendall(json.dumps(body).encode())


def _read_request(conn: socket.socket) -> tuple[str, int]:
    """The job and rank of one request line; ValueError for anything else."""
    data = b""
    while b"\n" not in data and len(data) <= MAX_REQUEST_BYTES:
        chunk = conn.recv(MAX_REQUEST_BYTES + 1 - len(data))
        if not chunk:
            break
        data += chunk
    if len(data) > MAX_REQUEST_BYTES:
        raise ValueError(f"request longer than {MAX_REQUEST_BYTES} bytes")
    request = json.loads(data.partition(b"\n")[0])
    if not isinstance(request, dict):
        raise ValueError("request must be a JSON object")
    job, rank = request.get("job"), request.get("rank")
    if not isinstance(job, str) or not job:
        raise ValueError("job must be a non-empty string")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < 10_000_000:
        raise ValueError("rank must be a non-negative integer")
    return job, rank


class CommandSocket(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Serves Store.pending_for to the processes of each job, until shutdown()."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, path: Path, store: Store, resolver: Resolver | None = None) -> None:
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise SystemExit(f"{path} exists and is not a socket; refusing to replace it")
            path.unlink()
        self.store = store
        self.resolver = resolver or Resolver()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refusals = RefusalLog("command polls")
        super().__init__(str(path), _Handler)
        # Same audience as the report socket: the training users' shared group.
        os.chmod(path, 0o660)
        self.path = path
        self.inode = path.stat().st_ino

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: the rank polls again
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.5},
                                  name="trainwatch-commands", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Stop serving and remove the socket file, unless a newer exporter replaced it."""
        self.shutdown()
        self.server_close()
        try:
            if self.path.stat().st_ino == self.inode:
                self.path.unlink()
        except FileNotFoundError:
            pass


class _Handler(socketserver.BaseRequestHandler):
    server: CommandSocket

    def handle(self) -> None:
        conn: socket.socket = self.request
        conn.settimeout(CONNECTION_SECONDS)
        server = self.server
        sender = server.resolver.of_connection(conn)
        try:
            job, rank = _read_request(conn)
        except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
            _answer(conn, {"error": f"bad request: {exc}", "status": 400})
            return
        try:
            commands = server.store.pending_for(job, rank, sender.identity)
        except NotOwner as exc:
            server.refusals.once(sender, exc.job, exc.owner)
            _answer(conn, {"error": f"job {job!r} is not this process's job", "status": 403})
            return
        _answer(conn, {"commands": commands})
