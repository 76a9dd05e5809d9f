"""Datagram receiver: one thread reading every rank's reports from the node's Unix socket.

Every datagram arrives with its sender's kernel credentials (SO_PASSCRED), read in one place
(senders.py), and serves two checks:

- the store accepts it only from the identity its job name is bound to (Store.ingest): a
  process of another user cannot report for, or replay a captured datagram of, someone else's
  job. A refusal is counted on every datagram and logged once per sender and job;
- with a RankWatch, the receiver tells it which process each rank is (an accepted datagram
  only), and between datagrams (at most every half second) has it look for ranks whose
  process is gone.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import threading
from pathlib import Path

from trainwatch.exporters.contract.wire import MAX_DATAGRAM_BYTES, WireError, decode
from trainwatch.exporters.node.training.rank_watch import RankWatch
from trainwatch.exporters.node.training.senders import (
    ANCILLARY_BYTES,
    RefusalLog,
    Resolver,
    pass_credentials,
)
from trainwatch.exporters.node.training.store import NotOwner, Store

log = logging.getLogger(__name__)
RECEIVE_TIMEOUT_SECONDS = 0.5  # the idle tick: expiry, and the rank watch's check
BUFFER_BYTES = MAX_DATAGRAM_BYTES + 4096


def bind_socket(path: Path) -> socket.socket:
    """Bind the Unix datagram socket, replacing a stale socket file but never another file."""
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise SystemExit(f"--socket {path} exists and is not a socket; refusing to replace it")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    pass_credentials(sock)  # before bind: no datagram arrives without its sender's credentials
    sock.bind(str(path))
    # Ranks may run as another user than the exporter: they reach the socket through the
    # shared group (the deploy puts the training users in it); nobody else may send.
    os.chmod(path, 0o660)
    sock.settimeout(RECEIVE_TIMEOUT_SECONDS)
    return sock


class Receiver(threading.Thread):
    """Decodes datagrams into the store until stopped; malformed ones are counted, not fatal."""

    def __init__(self, sock: socket.socket, store: Store, watch: RankWatch | None = None,
                 resolver: Resolver | None = None) -> None:
        super().__init__(name="trainwatch-receiver", daemon=True)
        self._sock = sock
        self._store = store
        self._watch = watch
        self._resolver = resolver or Resolver()
        self._stopping = threading.Event()
        self._refusals = RefusalLog("datagrams")

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        expire_every = 50
        while not self._stopping.is_set():
            try:
                data, ancillary, _, _ = self._sock.recvmsg(BUFFER_BYTES, ANCILLARY_BYTES)
            except TimeoutError:
                self._store.expire()
                self._check_ranks()
                continue
            except OSError as exc:
                log.warning("receive failed: %s", exc)
                continue
            self._ingest(data, ancillary)
            expire_every -= 1
            if expire_every == 0:
                expire_every = 50
                self._store.expire()
            self._check_ranks()

    def _ingest(self, data: bytes, ancillary: list[tuple[int, int, bytes]]) -> None:
        sender = self._resolver.of_datagram(ancillary)
        if sender is None:  # the kernel attaches them with SO_PASSCRED: fail closed
            self._store.malformed += 1
            return
        try:
            report = decode(data)
            self._store.ingest(report, sender.identity)
        except NotOwner as exc:
            self._refusals.once(sender, exc.job, exc.owner)
            return
        except WireError as exc:
            self._store.malformed += 1
            log.debug("malformed datagram: %s", exc)
            return
        except Exception:  # a bug must not end ingestion for good: count, log, go on
            self._store.malformed += 1
            log.exception("datagram could not be ingested")
            return
        if self._watch is not None:
            self._watch.saw(report, sender.process)

    def _check_ranks(self) -> None:
        """Judge the ranks whose process is gone, once every datagram they sent is read: a
        process's datagrams are queued on the socket when its send returns, so draining the
        queue after seeing it gone reads its last word (finished, exiting) if it said one."""
        if self._watch is None or not self._watch.due():
            return
        ended = self._watch.ended()
        if not ended:
            return
        self._sock.setblocking(False)
        try:
            while True:
                try:
                    data, ancillary, _, _ = self._sock.recvmsg(BUFFER_BYTES, ANCILLARY_BYTES)
                except BlockingIOError:
                    break
                except OSError as exc:
                    log.warning("receive failed: %s", exc)
                    break
                self._ingest(data, ancillary)
        finally:
            self._sock.settimeout(RECEIVE_TIMEOUT_SECONDS)
        self._watch.judge(ended)

