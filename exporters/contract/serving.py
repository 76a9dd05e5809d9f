"""How every Trainwatch HTTP service is served: one WSGI app under waitress, in the process
that owns the state the app reads (the remediation service, the training exporter and its
control API, the log scanner).

Why waitress (issue 11; measured by benchmarks/webhook.py and tests/remediation/
test_slow_clients.py): gunicorn's gthread worker hands every new connection to a handler
thread at once, and that thread blocks reading the request, so eight clients that sent their
headers slowly held all eight threads and stopped every intake, scrape and health request.
Waitress reads requests in one non-blocking I/O loop and gives a handler thread only a request
that has fully arrived (headers and body), so slow or idle connections cost a socket, never a
thread. On top of that: a request must arrive completely within `request_timeout_seconds` (a
client trickling a byte at a time is cut off), an idle connection is closed after
`idle_timeout_seconds`, and at most `max_connections` are open at once (poll(), not select(),
so that is not capped at 1024 descriptors). It runs in one process, so an app's in-memory
state (the training exporter's store) is the process's; a crash is restarted by systemd or
supervisor, as every other Trainwatch service is.

The one exception is the GPU exporter (exporters/node/gpu/http_server.py): it answers one path, and
its own memory share is a measured goal (docs/performance.md, "The exporter's own memory");
importing waitress would add about 1.6 MiB over `socketserver` there.
"""

from __future__ import annotations

import logging
import signal
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

log = logging.getLogger("trainwatch.serving")
MAX_HEADER_BYTES = 65536


@dataclass(frozen=True)
class Limits:
    """What one service allows its clients; the defaults suit a scrape target."""

    threads: int = 4
    max_connections: int = 1000
    request_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 30.0
    max_body_bytes: int = 1024 * 1024


class _DeadlineChannel(HTTPChannel):  # type: ignore[misc]
    """Remembers when the request being read began, for the server's deadline sweep."""

    request_began: float | None = None

    def received(self, data: bytes) -> bool:
        if self.request is None and data:
            self.request_began = time.monotonic()
        return bool(super().received(data))


@dataclass(frozen=True)
class Tls:
    """The certificate (chain) and key a service presents; with them it speaks only TLS."""

    cert_file: str
    key_file: str

    def context(self) -> ssl.SSLContext:
        """A server context: TLS 1.2 or newer, the files loaded (ssl.SSLError, OSError when
        they cannot be)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


class _TlsChannel(_DeadlineChannel):
    """A channel on a non-blocking TLS socket: the handshake and every record happen in the
    I/O loop, a step at a time, so a slow or silent client costs a socket, never a thread
    (the same promise as plain HTTP). Anything that is not TLS (plain HTTP on this port, a
    client that refuses the certificate) ends the handshake and the connection."""

    _handshaken = False

    def handle_read(self) -> None:
        sock = self.socket
        try:
            if not self._handshaken:
                sock.do_handshake()
                self._handshaken = True
            data = sock.recv(self.adj.recv_bytes)
            while data and sock.pending():  # decrypted bytes poll() cannot see
                data += sock.recv(sock.pending())
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError as exc:  # ssl.SSLError included: not TLS, or not our TLS
            log.debug("TLS connection from %s closed: %s", self.addr, exc)
            self.handle_close()
            return
        if not data:
            self.handle_close()
            return
        self.last_activity = time.time()
        self.received(data)

    def send(self, data: bytes, do_close: bool = True) -> int:
        try:
            return int(self.socket.send(data))
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return 0
        except OSError:
            if do_close:
                self.handle_close()
            return 0


class Server(TcpWSGIServer):  # type: ignore[misc]
    channel_class = _DeadlineChannel
    request_timeout = 10.0
    tls_context: ssl.SSLContext | None = None

    def handle_accept(self) -> None:
        if self.tls_context is None:
            super().handle_accept()
            return
        try:
            accepted = self.accept()
            if accepted is None:
                return
            conn, addr = accepted
            conn = self.tls_context.wrap_socket(conn, server_side=True,
                                                do_handshake_on_connect=False)
        except OSError:
            return  # the client left before we got to it
        _TlsChannel(self, conn, self.fix_addr(addr), self.adj, map=self._map)

    def maintenance(self, now: float) -> None:
        """waitress closes idle channels; also close those whose request has been arriving for
        longer than request_timeout (slow headers or body), unless it is being served."""
        super().maintenance(now)
        cutoff = time.monotonic() - self.request_timeout
        for channel in list(self.active_channels.values()):
            began = getattr(channel, "request_began", None)
            if (channel.request is not None and not channel.requests and began is not None
                    and began < cutoff):
                channel.will_close = True

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the one the OS chose for port 0)."""
        return int(self.socket.getsockname()[1])


def make_server(app: Any, bind: str, port: int, *, limits: Limits = Limits(),
                ident: str = "trainwatch", tls: Tls | None = None) -> Server:
    """A server bound to bind:port (IPv6 when bind has a ':'), accepting once run() is called;
    with `tls`, HTTPS only. Raises OSError when the address cannot be bound or the TLS files
    cannot be loaded (ssl.SSLError is one)."""
    context = tls.context() if tls is not None else None
    adj = Adjustments(
        host=bind, port=port, threads=limits.threads, connection_limit=limits.max_connections,
        channel_timeout=max(int(limits.idle_timeout_seconds), 1), cleanup_interval=1,
        asyncore_use_poll=True, max_request_header_size=MAX_HEADER_BYTES,
        max_request_body_size=limits.max_body_bytes + MAX_HEADER_BYTES, ident=ident)
    dispatcher = ThreadedTaskDispatcher()
    dispatcher.set_thread_count(adj.threads)
    server = Server(app, map={}, dispatcher=dispatcher, adj=adj, sockinfo=adj.listen[0])
    server.request_timeout = limits.request_timeout_seconds
    server.tls_context = context
    return server


def serve_until_signal(server: Server, on_stop: Callable[[], None] | None = None) -> None:
    """Serve on this thread until SIGTERM or SIGINT, then close the server and call on_stop.

    SIGHUP stops the service too (systemd's ExecReload and `supervisorctl signal HUP` send
    it): a Trainwatch service has no configuration to re-read in place, and its supervisor
    starts it again with the current one."""

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    try:
        server.run()
    finally:
        server.close()
        if on_stop is not None:
            on_stop()


class Background:
    """A server on a daemon thread, for a process whose main thread runs its own loop (the log
    scanner). The I/O loop runs one poll at a time so that stop() can end it between polls:
    waitress's channels are only ever touched by the thread that polls them."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        adj = self.server.adj
        while not self._stopping.is_set():
            self.server.asyncore.loop(timeout=adj.asyncore_loop_timeout, map=self.server._map,
                                      use_poll=adj.asyncore_use_poll, count=1)

    def stop(self, timeout: float = 10.0) -> None:
        """End the I/O loop, then close the channels and the server from this thread.

        The closing happens here, after the join, and not on the loop's way out: the loop can
        see the flag and return before the trigger is pulled, and a trigger closed by then
        made the pull fail with EBADF (a SIGTERM that exited 1)."""
        self._stopping.set()
        self.server.pull_trigger()  # wake the poll now, not at its timeout
        self._thread.join(timeout)
        for channel in list(self.server._map.values()):
            if channel is not self.server.trigger:
                channel.close()
        self.server.close()
        self.server.task_dispatcher.shutdown()
