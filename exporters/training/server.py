"""`training-exporter`: the node training exporter (datagram receiver + /metrics + control API).

Served by gunicorn with one gthread worker: a production HTTP server (timeouts, graceful
SIGTERM, a master that restarts a crashed worker) while the datagram receiver and the HTTP
handlers share one process's memory, which they must because the store is in memory.
More workers would split the store, so the worker count is fixed at 1; threads serve the
concurrent scrapes and control calls.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication
from prometheus_client import CollectorRegistry

from exporters.catalog import DEFAULT_EXPORTER_SOCKET, PORTS
from exporters.training.collector import TrainingCollector
from exporters.training.command_log import CommandLog
from exporters.training.control_api import ControlApp
from exporters.training.launcher import node_name
from exporters.training.receiver import Receiver, bind_socket
from exporters.training.store import Store

log = logging.getLogger("trainwatch.training_exporter")


def read_token(path: Path | None) -> str | None:
    """The control token, or None (API disabled) when no file is configured."""
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise SystemExit(f"--token-file {path}: cannot read: {exc.strerror}") from None
    if len(token) < 16:
        raise SystemExit(f"--token-file {path}: token must be at least 16 characters")
    if path.stat().st_mode & 0o004:
        log.warning("--token-file %s is world-readable; use mode 0600 or 0640", path)
    return token


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="training-exporter", description=__doc__.splitlines()[0])
    parser.add_argument("--bind", default="0.0.0.0",  # noqa: S104 - by contract
                        help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=PORTS["training_exporter"])
    parser.add_argument("--socket", type=Path, default=Path(DEFAULT_EXPORTER_SOCKET),
                        help="Unix datagram socket the ranks send to")
    parser.add_argument("--token-file", type=Path, default=None,
                        help="file holding the control API bearer token (API off without it)")
    parser.add_argument("--node", default=node_name(), help="value of the node label")
    parser.add_argument("--job-expiry-seconds", type=float, default=600.0,
                        help="drop a job's series this long after its last report")
    parser.add_argument("--threads", type=int, default=4, help="HTTP handler threads")
    parser.add_argument("--command-log", type=Path, default=None,
                        help="SQLite file that keeps accepted commands and their outcomes "
                        "across exporter restarts (memory only without it)")
    args = parser.parse_args(argv)
    try:
        ipaddress.ip_address(args.bind)
    except ValueError:
        parser.error(f"--bind {args.bind!r} is not an IP address")
    if not 0 < args.port < 65536:
        parser.error("--port must be in 1..65535")
    if not args.socket.parent.is_dir():
        parser.error(f"--socket directory {args.socket.parent} does not exist")
    if not args.node or len(args.node) > 253:
        parser.error("--node must be a non-empty host name")
    if not 1 <= args.job_expiry_seconds <= 7 * 86400:
        parser.error("--job-expiry-seconds must be between 1 and 604800")
    if args.command_log is not None and not args.command_log.parent.is_dir():
        parser.error(f"--command-log directory {args.command_log.parent} does not exist")
    if not 1 <= args.threads <= 64:
        parser.error("--threads must be between 1 and 64")
    return args


class _GunicornApp(BaseApplication):
    """gunicorn configured from code (it must not read our argv)."""

    def __init__(self, factory: Callable[[], Any], options: dict[str, Any]) -> None:
        self._factory = factory
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return self._factory()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    token = read_token(args.token_file)
    if token is None:
        log.warning("no --token-file: control API answers 503 (fail closed)")
    state: dict[str, Any] = {}

    def build_app() -> ControlApp:
        """Runs in the worker: the socket, receiver thread and store live there."""
        store = Store(args.job_expiry_seconds)
        if args.command_log is not None:
            store.attach_log(CommandLog(args.command_log))
        sock = bind_socket(args.socket)
        receiver = Receiver(sock, store)
        receiver.start()
        state.update(receiver=receiver, sock=sock, inode=args.socket.stat().st_ino)
        registry = CollectorRegistry()
        registry.register(TrainingCollector(store, args.node))
        log.info("receiving on %s, serving on %s:%d", args.socket, args.bind, args.port)
        return ControlApp(store, registry, token)

    def on_worker_exit(server: Any, worker: Any) -> None:
        if "receiver" in state:
            state["receiver"].stop()
            state["sock"].close()
            # On a reload (SIGHUP) the next worker has already bound its own socket file at
            # this path: remove the file only if it is still ours.
            try:
                if args.socket.stat().st_ino == state["inode"]:
                    args.socket.unlink()
            except FileNotFoundError:
                pass

    host = f"[{args.bind}]" if ":" in args.bind else args.bind
    _GunicornApp(build_app, {
        "bind": f"{host}:{args.port}",
        "workers": 1,
        "worker_class": "gthread",
        "threads": args.threads,
        "timeout": 30,
        "graceful_timeout": 5,
        "keepalive": 5,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": "warning",
        "worker_exit": on_worker_exit,
        "proc_name": "training-exporter",
    }).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
