"""`remediation-server --config FILE`: the app under waitress, with the worker threads that run
actions in the same process (the store is shared with any other instance through SQLite on one
host or PostgreSQL across hosts, so running two servers on one store is also safe).

Why waitress and not gunicorn's gthread worker: gthread hands every new connection to a handler
thread at once, and that thread blocks reading the request, so eight clients that send their
headers slowly held all eight threads and stopped every intake and health request. Waitress
reads requests in one non-blocking I/O loop and gives a handler thread only a request that has
fully arrived (headers and body), so slow or idle connections cost a socket, never a thread.
On top of that: a request must arrive completely within `request_timeout_seconds` (a client
trickling a byte at a time is cut off), an idle connection is closed after
`idle_timeout_seconds`, and at most `max_connections` are open at once (poll(), not select(),
so that is not capped at 1024 descriptors).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

from remediation.app import create_app
from remediation.config import Config, ConfigError, load_config
from remediation.marker import StoreResetError, check_store, write_marker
from remediation.playbooks import PlaybookError, load_playbooks
from remediation.stores import open_store, store_errors
from remediation.worker import Worker

log = logging.getLogger("remediation.server")


class _DeadlineChannel(HTTPChannel):  # type: ignore[misc]
    """Remembers when the request being read began, for the server's deadline sweep."""

    request_began: float | None = None

    def received(self, data: bytes) -> bool:
        if self.request is None and data:
            self.request_began = time.monotonic()
        return bool(super().received(data))


class _Server(TcpWSGIServer):  # type: ignore[misc]
    channel_class = _DeadlineChannel
    request_timeout = 10.0

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


def make_server(app: Any, config: Config) -> _Server:
    """A waitress server bound to the config's address, accepting once run() is called."""
    adj = Adjustments(
        host=config.bind, port=config.port, threads=config.http_threads,
        connection_limit=config.max_connections,
        channel_timeout=max(int(config.idle_timeout_seconds), 1), cleanup_interval=1,
        asyncore_use_poll=True, max_request_header_size=65536,
        max_request_body_size=config.max_body_bytes + 65536, ident="trainwatch-remediation")
    dispatcher = ThreadedTaskDispatcher()
    dispatcher.set_thread_count(adj.threads)
    server = _Server(app, map={}, dispatcher=dispatcher, adj=adj, sockinfo=adj.listen[0])
    server.request_timeout = config.request_timeout_seconds
    return server


def serve(config: Config) -> None:
    store = open_store(config)
    books = load_playbooks(config.playbooks_dir)
    worker = Worker(config, store, books)
    app = create_app(config, worker=worker, store=store, books=books)
    server = make_server(app, config)
    worker.start()

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("listening on %s:%d", config.bind, config.port)
    try:
        server.run()
    finally:
        worker.stop()
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="remediation-server", description=__doc__)
    parser.add_argument("--config", required=True, type=Path, help="YAML config file")
    parser.add_argument("--bind", help="override the config's bind address")
    parser.add_argument("--port", type=int, help="override the config's port")
    parser.add_argument("--accept-new-store", action="store_true",
                        help="start even though the store is missing, empty or another one "
                             "than the marker file names (it was reset or replaced): alerts "
                             "already acted on may be acted on again")
    parser.add_argument("--check-config", action="store_true",
                        help="validate the config, the files it names and the playbooks, then "
                             "exit (0 valid, 2 not) without opening the store: the deploy "
                             "checks a config this way before it replaces the running one")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
        load_playbooks(config.playbooks_dir)  # fail before binding, with a clear message
        if args.check_config:
            print(f"remediation-server: {args.config}: valid")
            return 0
        check_store(config, accept_new=args.accept_new_store)
        store = open_store(config)
        write_marker(config, store)
        store.close()
    except (ConfigError, PlaybookError, StoreResetError) as exc:
        print(f"remediation-server: {exc}", file=sys.stderr)
        return 2
    except (OSError, *store_errors(config)) as exc:
        print(f"remediation-server: cannot open store {config.store_location}: {exc}",
              file=sys.stderr)
        return 2
    overrides: dict[str, Any] = {}
    if args.bind:
        overrides["bind"] = args.bind
    if args.port is not None:
        if not 1 <= args.port <= 65535:
            print("remediation-server: --port must be 1..65535", file=sys.stderr)
            return 2
        overrides["port"] = args.port
    if overrides:
        config = replace(config, **overrides)
    try:
        serve(config)
    except OSError as exc:  # the port is taken, the address is not local
        print(f"remediation-server: cannot listen on {config.bind}:{config.port}: {exc}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
