"""HTTP exposition: the snapshot's text is rendered once per snapshot, not once per scrape.

A snapshot is immutable, so its ~500 lines of exposition text are formatted when a scrape
first sees it and reused until the next cycle; each scrape formats only the few live series
(age, staleness, XID and self counters, process metrics). prometheus_client still does all
the formatting (generate_latest); this module only decides what to cache.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.process_collector import ProcessCollector

from exporters.gpu.exposition import GpuCollector
from exporters.gpu.snapshot import Snapshot


class _Families:
    """The minimal 'registry' generate_latest needs: something with collect()."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class _Live:
    def __init__(self, collector: GpuCollector) -> None:
        self.collector = collector

    def collect(self) -> Iterator[Metric]:
        return self.collector.live_families(self.collector.loop.snapshot)


class ExpositionApp:
    """WSGI app serving /metrics from the GPU collector plus process metrics."""

    def __init__(self, collector: GpuCollector, process_metrics: bool = True) -> None:
        self.collector = collector
        self.live = CollectorRegistry(auto_describe=False)
        self.live.register(_Live(collector))
        if process_metrics:
            ProcessCollector(registry=self.live)
        self._lock = threading.Lock()
        self._cached: tuple[Snapshot | None, bytes] = (None, b"")

    def render(self) -> bytes:
        snapshot, families = self.collector.snapshot_part()
        with self._lock:
            cached_for, text = self._cached
            if cached_for is not snapshot or snapshot is None:
                text = generate_latest(_Families(families))  # type: ignore[arg-type]
                self._cached = (snapshot, text)
        return text + generate_latest(self.live)

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("PATH_INFO") not in ("/metrics", "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found; metrics are at /metrics\n"]
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        body = self.render()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST),
                                  ("Content-Length", str(len(body)))])
        return [b""] if environ["REQUEST_METHOD"] == "HEAD" else [body]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would drown the log."""


def serve(app: ExpositionApp, bind: str, port: int) -> tuple[ThreadingWSGIServer,
                                                                threading.Thread]:
    """Start serving on a daemon thread (thread per request: a slow client blocks no one)."""

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in bind else socket.AF_INET

    httpd = make_server(bind, port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="http", daemon=True)
    thread.start()
    return httpd, thread
