"""`training-exporter`: the node training exporter (datagram receiver + /metrics + control API).

Served by trainwatch.exporters.contract.serving (waitress) in one process: the datagram receiver
thread and the
HTTP handlers share the in-memory store, and a client that sends its request slowly holds a
socket, never one of the handler threads that answer scrapes and control calls.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sqlite3
import ssl
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from trainwatch.exporters import add_version_argument
from trainwatch.exporters.contract import catalog, serving
from trainwatch.exporters.contract.catalog import DEFAULT_EXPORTER_SOCKET, PORTS, command_socket
from trainwatch.exporters.contract.launcher import node_name
from trainwatch.exporters.contract.tokens import SecretFileError, read_token_file
from trainwatch.exporters.node import fast_alerts
from trainwatch.exporters.node.training.collector import TrainingCollector
from trainwatch.exporters.node.training.command_log import CommandLog
from trainwatch.exporters.node.training.command_socket import CommandSocket
from trainwatch.exporters.node.training.control_api import MAX_BODY_BYTES, ControlApp
from trainwatch.exporters.node.training.ledger import ZERO_HOLD_SECONDS, Ledger, LedgerFile
from trainwatch.exporters.node.training.rank_watch import KilledRank, RankWatch
from trainwatch.exporters.node.training.receiver import Receiver, bind_socket
from trainwatch.exporters.node.training.senders import Resolver
from trainwatch.exporters.node.training.store import DEPARTED_AFTER_SECONDS, Store

log = logging.getLogger("trainwatch.training_exporter")


def read_token(path: Path | None) -> str | None:
    """The control token, or None (API disabled) when no file is configured."""
    if path is None:
        return None
    try:
        return read_token_file(path)
    except SecretFileError as exc:
        raise SystemExit(f"--token-file: {exc}") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="training-exporter", description=__doc__.splitlines()[0])
    add_version_argument(parser)
    parser.add_argument("--bind", default="0.0.0.0",  # noqa: S104 - by contract
                        help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=PORTS["training_exporter"])
    parser.add_argument("--socket", type=Path, default=Path(DEFAULT_EXPORTER_SOCKET),
                        help="Unix datagram socket the ranks send to")
    parser.add_argument("--token-file", type=Path, default=None,
                        help="file holding the control API bearer token (API off without it)")
    parser.add_argument("--tls-cert", type=Path, default=None,
                        help="certificate (chain) to serve HTTPS with; with --tls-key, the "
                        "port speaks only TLS (the control API carries a token)")
    parser.add_argument("--tls-key", type=Path, default=None, help="the certificate's key")
    parser.add_argument("--node", default=node_name(), help="value of the node label (also "
                        "the fast alerts': the inventory host name)")
    fast_alerts.add_arguments(parser, what="a killed rank (TrainingJobVanished)", node=False)
    parser.add_argument("--job-expiry-seconds", type=float, default=600.0,
                        help="drop a job's series this long after its last report")
    parser.add_argument("--rank-departed-seconds", type=float, default=DEPARTED_AFTER_SECONDS,
                        help="a rank silent this long no longer counts as a member a command "
                        "waits for (its series stay until the job expires)")
    parser.add_argument("--threads", type=int, default=4, help="HTTP handler threads")
    parser.add_argument("--command-log", type=Path, default=None,
                        help="SQLite file that keeps accepted commands and their outcomes "
                        "across exporter restarts (memory only without it)")
    parser.add_argument("--goodput-state", type=Path, default=None,
                        help="SQLite file that keeps the goodput counters across exporter "
                        "restarts (memory only without it; docs/goodput.md)")
    parser.add_argument("--goodput-zero-seconds", type=float, default=ZERO_HOLD_SECONDS,
                        help="serve a new job's goodput counters at zero this long first, so "
                        "that rate() counts its startup: at least the scrape interval")
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
    if not 2 <= args.rank_departed_seconds <= 3600:
        parser.error("--rank-departed-seconds must be between 2 and 3600 (ranks heartbeat "
                     "every second)")
    if args.command_log is not None and not args.command_log.parent.is_dir():
        parser.error(f"--command-log directory {args.command_log.parent} does not exist")
    if args.goodput_state is not None and not args.goodput_state.parent.is_dir():
        parser.error(f"--goodput-state directory {args.goodput_state.parent} does not exist")
    if not 0 <= args.goodput_zero_seconds <= 3600:
        parser.error("--goodput-zero-seconds must be between 0 and 3600")
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    for tls_file in (args.tls_cert, args.tls_key):
        if tls_file is not None and not tls_file.is_file():
            parser.error(f"{tls_file} is not a file")
    if not 1 <= args.threads <= 64:
        parser.error("--threads must be between 1 and 64")
    try:
        args.alertmanager_urls = fast_alerts.check_settings(args.alertmanager_urls, args.node)
        args.alertmanager_credential = fast_alerts.read_credential(
            args.alertmanager_username, args.alertmanager_password_file)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def watch_ranks(store: Store, alerts: fast_alerts.FastAlerts, node: str) -> RankWatch:
    """The rank watch that posts each launch's first killed rank as the rule's alert would
    name it (alert_rules/training.py, TrainingJobVanished with its `rank`): the remediation
    service requeues the job, and its rails absorb the rule's alert that follows."""
    def post(killed: KilledRank) -> None:
        log.warning("rank %d of job %s (pid %d) was killed: posting TrainingJobVanished",
                    killed.rank, killed.job, killed.pid)
        alerts.post("TrainingJobVanished", {
            catalog.LABEL_JOB: killed.job, catalog.LABEL_RANK: str(killed.rank),
            catalog.LABEL_NODE: node, "severity": "critical", "component": "training"},
            f"Job {killed.job} vanished without finishing; rank {killed.rank} stopped first "
            f"(its process {killed.pid} on {node} ended without a clean finish or an error "
            "of its own: killed)")
    return RankWatch(store, post)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    token = read_token(args.token_file)
    if token is None:
        log.warning("no --token-file: control API answers 503 (fail closed)")
    try:
        ledger = Ledger(LedgerFile(args.goodput_state) if args.goodput_state else None,
                        end_after=args.rank_departed_seconds,
                        zero_hold=args.goodput_zero_seconds)
    except sqlite3.Error as exc:
        raise SystemExit(f"--goodput-state {args.goodput_state}: {exc}") from None
    store = Store(args.job_expiry_seconds, departed_after=args.rank_departed_seconds,
                  goodput=ledger)
    alerts = fast_alerts.FastAlerts(args.alertmanager_urls,
                                    credential=args.alertmanager_credential) \
        if args.alertmanager_urls else None
    registry = CollectorRegistry()
    registry.register(TrainingCollector(store, args.node, alerts))
    try:
        server = serving.make_server(
            ControlApp(store, registry, token), args.bind, args.port, ident="training-exporter",
            limits=serving.Limits(threads=args.threads, max_body_bytes=MAX_BODY_BYTES),
            tls=serving.Tls(str(args.tls_cert), str(args.tls_key)) if args.tls_cert else None)
    except ssl.SSLError as exc:
        raise SystemExit(f"training-exporter: --tls-cert/--tls-key: {exc}") from None
    except OSError as exc:
        raise SystemExit(f"training-exporter: cannot listen on {args.bind}:{args.port}: "
                         f"{exc.strerror or exc}") from None
    if args.command_log is not None:
        store.attach_log(CommandLog(args.command_log))
    sock = bind_socket(args.socket)
    inode = args.socket.stat().st_ino
    resolver = Resolver()  # the kernel's credentials: the report and the command socket's
    receiver = Receiver(sock, store,
                        watch_ranks(store, alerts, args.node) if alerts is not None else None,
                        resolver)
    receiver.start()
    commands = CommandSocket(Path(command_socket(str(args.socket))), store, resolver)
    commands.start()

    def on_stop() -> None:
        receiver.stop()
        commands.close()
        if alerts is not None:
            alerts.close()
        ledger.close()  # the counters as last served stay on disk
        sock.close()
        # A new exporter may already have bound its own socket file at this path (a restart
        # that overlapped this one's exit): remove the file only if it is still ours.
        try:
            if args.socket.stat().st_ino == inode:
                args.socket.unlink()
        except FileNotFoundError:
            pass

    log.info("receiving on %s, commands on %s, serving on %s:%d", args.socket, commands.path,
             args.bind, args.port)
    serving.serve_until_signal(server, on_stop=on_stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
