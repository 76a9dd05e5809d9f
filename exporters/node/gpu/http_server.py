"""HTTP exposition: the snapshot's text is rendered once per snapshot, not once per scrape.

A snapshot is immutable, so its ~500 lines of exposition text are formatted when a scrape
first sees it and reused until the next cycle; each scrape formats only the few live series
(age, staleness, XID and self counters, process metrics).

The server is `socketserver` with a minimal HTTP/1.0 handler (GET/HEAD of /metrics, one
response per connection: a scrape every few seconds needs no keep-alive). This is the one Trainwatch
service not served by trainwatch.exporters.contract.serving (waitress), for a measured reason: the
exporter's own memory share is a goal (<= 10 MiB above python + pynvml; 7.3 MiB,
docs/performance.md "The exporter's own memory"), and importing waitress costs about 1.6 MiB
more than `socketserver` here, for a server that answers one path. Why not wsgiref,
http.server or prometheus_client's server: each imports http.client, which imports `ssl` and
`email`; together with prometheus_client that was about 10 MiB of the exporter's RSS
(benchmarks/gpu_exporter.py). The request is untrusted input: the request line and headers
are read with bounded lengths and counts, within a socket timeout, and only the method and
path are looked at.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading

from trainwatch.exporters.node.gpu.exposition import GpuCollector
from trainwatch.exporters.node.gpu.process_metrics import ProcessMetrics
from trainwatch.exporters.node.gpu.snapshot import Snapshot
from trainwatch.exporters.node.gpu.text_format import CONTENT_TYPE, Family, render

MAX_LINE = 8192  # bytes in the request line or one header line
MAX_HEADERS = 100
REQUEST_TIMEOUT = 10.0  # seconds a client may take to send its request

Response = tuple[str, list[tuple[str, str]], bytes]


class ExpositionApp:
    """Answers /metrics from the GPU collector plus process metrics."""

    def __init__(self, collector: GpuCollector, process_metrics: bool = True) -> None:
        self.collector = collector
        self.process = ProcessMetrics() if process_metrics else None
        self._lock = threading.Lock()
        self._cached: tuple[Snapshot | None, bytes] = (None, b"")

    def render(self) -> bytes:
        snapshot, families = self.collector.snapshot_part()
        with self._lock:
            cached_for, text = self._cached
            if cached_for is not snapshot or snapshot is None:
                text = render(families)
                self._cached = (snapshot, text)
        live: list[Family] = list(self.collector.live_families(self.collector.loop.snapshot))
        if self.process is not None:
            live += self.process.collect()
        return text + render(live)

    def respond(self, method: str, path: str) -> Response:
        """(status, headers, body) for one request."""
        if path not in ("/metrics", "/"):
            return "404 Not Found", [("Content-Type", "text/plain")], \
                b"not found; metrics are at /metrics\n"
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", [("Allow", "GET, HEAD")], b""
        body = self.render()
        headers = [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body)))]
        return "200 OK", headers, (b"" if method == "HEAD" else body)


class _Handler(socketserver.StreamRequestHandler):
    timeout = REQUEST_TIMEOUT
    server: _Server

    def handle(self) -> None:
        try:
            response = self._respond()
        except OSError:  # the client went away or timed out: nothing to answer
            return
        status, headers, body = response
        head = "".join(f"{k}: {v}\r\n" for k, v in headers)
        if not any(k == "Content-Length" for k, _ in headers):
            head += f"Content-Length: {len(body)}\r\n"
        with contextlib.suppress(OSError):  # the client went away mid-response
            self.wfile.write(f"HTTP/1.0 {status}\r\n{head}Connection: close\r\n\r\n"
                             .encode("latin-1") + body)

    def _respond(self) -> Response:
        bad: Response = ("400 Bad Request", [("Content-Type", "text/plain")], b"bad request\n")
        line = self.rfile.readline(MAX_LINE + 1)
        parts = line.split()
        if len(line) > MAX_LINE or len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return bad
        for _ in range(MAX_HEADERS + 1):  # headers are read (to drain them) and ignored
            header = self.rfile.readline(MAX_LINE + 1)
            if len(header) > MAX_LINE:
                return bad
            if header in (b"\r\n", b"\n", b""):
                break
        else:
            return bad
        method = parts[0].decode("latin-1")
        path = parts[1].split(b"?", 1)[0].decode("latin-1")
        return self.server.app.respond(method, path)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True  # a slow client blocks no one, and never blocks shutdown
    allow_reuse_address = True
    app: ExpositionApp


def serve(app: ExpositionApp, bind: str, port: int) -> tuple[_Server, threading.Thread]:
    """Start serving on a daemon thread (thread per request: a slow client blocks no one)."""

    class Server(_Server):
        address_family = socket.AF_INET6 if ":" in bind else socket.AF_INET

    httpd = Server((bind, port), _Handler)
    httpd.app = app
    thread = threading.Thread(target=httpd.serve_forever, name="http", daemon=True)
    thread.start()
    return httpd, thread
