"""Datagram receiver: one thread reading every rank's reports from the node's Unix socket.

Every datagram arrives with its sender's kernel credentials (SO_PASSCRED), and the store
accepts it only from the identity its job name is bound to (senders.py, Store.ingest): a
process of another user cannot report for, or replay a captured datagram of, someone else's
job. A refusal is counted on every datagram and logged once per sender and job.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from pathlib import Path

from trainwatch.exporters.contract.wire import MAX_DATAGRAM_BYTES, WireError, decode
from trainwatch.exporters.node.training.senders import (
    ANCILLARY_BYTES,
    Resolver,
    Sender,
    receive_credentials,
)
from trainwatch.exporters.node.training.store import NotOwner, Store

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
    receive_credentials(sock)
    sock.settimeout(0.5)
    return sock


class Receiver(threading.Thread):
    """Decodes datagrams into the store until stopped; malformed ones are counted, not fatal."""

    def __init__(self, sock: socket.socket, store: Store, resolver: Resolver | None = None
                 ) -> None:
        super().__init__(name="trainwatch-receiver", daemon=True)
        self._sock = sock
        self._store = store
        self._resolver = resolver or Resolver()
        self._stopping = threading.Event()
        self._logged: set[tuple[int, int, str]] = set()  # (pid, uid, job) refusals logged

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        expire_every = 50
        while not self._stopping.is_set():
            try:
                data, ancillary, _flags, _addr = self._sock.recvmsg(
                    MAX_DATAGRAM_BYTES + 4096, ANCILLARY_BYTES)
            except TimeoutError:
                self._store.expire()
                continue
            except OSError as exc:
                log.warning("receive failed: %s", exc)
                continue
            sender = self._resolver.of_datagram(ancillary)
            if sender is None:  # the kernel attaches them with SO_PASSCRED: fail closed
                self._store.malformed += 1
                continue
            try:
                self._store.ingest(decode(data), sender.identity)
            except NotOwner as exc:
                self._log_refusal(sender, exc)
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

    def _log_refusal(self, sender: Sender, exc: NotOwner) -> None:
        key = (sender.pid, sender.uid, exc.job)
        if key in self._logged:
            return
        if len(self._logged) >= 4096:
            self._logged.clear()
        self._logged.add(key)
        log.warning("refused datagrams of pid %d (uid %d) for job %r: it belongs to %s",
                    key[0], key[1], exc.job, exc.owner)
