"""Datagram receiver: one thread reading every rank's reports from the node's Unix socket."""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from pathlib import Path

from trainwatch.exporters.contract.wire import MAX_DATAGRAM_BYTES, WireError, decode
from trainwatch.exporters.node.training.store import Store

log = logging.getLogger(__name__)


def bind_socket(path: Path) -> socket.socket:
    """Bind the Unix datagram socket, replacing a stale socket file but never another file."""
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise SystemExit(f"--socket {path} exists and is not a socket; refusing to replace it")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    # Ranks may run as another user than the exporter: they reach the socket through the
    # shared group (the deploy puts the training users in it); nobody else may send.
    os.chmod(path, 0o660)
    sock.settimeout(0.5)
    return sock


class Receiver(threading.Thread):
    """Decodes datagrams into the store until stopped; malformed ones are counted, not fatal."""

    def __init__(self, sock: socket.socket, store: Store) -> None:
        super().__init__(name="trainwatch-receiver", daemon=True)
        self._sock = sock
        self._store = store
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        expire_every = 50
        while not self._stopping.is_set():
            try:
                data = self._sock.recv(MAX_DATAGRAM_BYTES + 4096)
            except TimeoutError:
                self._store.expire()
                continue
            except OSError as exc:
                log.warning("receive failed: %s", exc)
                continue
            try:
                self._store.ingest(decode(data))
            except WireError as exc:
                self._store.malformed += 1
                log.debug("malformed datagram: %s", exc)
            except Exception:  # a bug must not end ingestion for good: count, log, go on
                self._store.malformed += 1
                log.exception("datagram could not be ingested")
            expire_every -= 1
            if expire_every == 0:
                expire_every = 50
                self._store.expire()
