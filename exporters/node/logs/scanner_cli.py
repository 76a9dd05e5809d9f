"""`trainwatch-logscan`: follow training logs (and the kernel log), export failure counters.

    trainwatch-logscan --bind 0.0.0.0 --port PORT --state-file /opt/trainwatch/data/logscan.json \
        [--kernel-log | --kernel-log-file FILE] [--job NAME] [--interval 1] PATH_OR_GLOB...
    trainwatch-logscan --once [--json] FILE...

`--once` reads each FILE from the start, prints the counts and exits 0. It is all-or-nothing:
if any FILE cannot be read it prints the reason, prints no counts and exits 2, because
partial counts would look like a clean log.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from prometheus_client import CollectorRegistry, make_wsgi_app

from trainwatch.exporters import add_version_argument
from trainwatch.exporters.contract import serving
from trainwatch.exporters.contract.catalog import PORTS
from trainwatch.exporters.contract.identity import JOB_NAME_PATTERN, is_job_name
from trainwatch.exporters.node.logs.follower import FileFollower, source_for
from trainwatch.exporters.node.logs.kmsg import KMSG_PATH, KmsgReader
from trainwatch.exporters.node.logs.metrics import ScannerCollector
from trainwatch.exporters.node.logs.scanner import Scanner, Source
from trainwatch.exporters.node.logs.state_file import StateFileError, load_state, save_state

PROG = "trainwatch-logscan"
_ONCE_CHUNK = 4 * 1024 * 1024
# Longest line kept whole; beyond it the line is classified in pieces (bounded memory).
_MAX_LINE = 16 * 1024 * 1024


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be an integer, got {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"port must be 1-65535, got {value}")
    return value


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"interval must be a number, got {text!r}") from None
    if not 0.01 <= value <= 3600:
        raise argparse.ArgumentTypeError("interval must be between 0.01 and 3600 seconds")
    return value


def _job(text: str) -> str:
    if not is_job_name(text):
        raise argparse.ArgumentTypeError(f"job name must match {JOB_NAME_PATTERN.pattern}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_version_argument(parser)
    parser.add_argument("paths", nargs="*", metavar="PATH_OR_GLOB",
                        help="log files or glob patterns (quote globs) to follow")
    parser.add_argument("--bind", default="0.0.0.0",  # noqa: S104 - contract default
                        help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=_port, default=PORTS["logscan"])
    parser.add_argument("--state-file", type=Path,
                        help="where read offsets are kept across restarts")
    kernel = parser.add_mutually_exclusive_group()
    kernel.add_argument("--kernel-log", action="store_true",
                        help=f"also read the kernel log ({KMSG_PATH}) for NVIDIA Xid errors")
    kernel.add_argument("--kernel-log-file", metavar="FILE",
                        help="follow a kernel log text file (kern.log, dmesg output) instead")
    parser.add_argument("--job", type=_job, default=None,
                        help="training_job label for lines and files that do not carry one")
    parser.add_argument("--interval", type=_interval, default=1.0,
                        help="seconds between polls (default 1)")
    parser.add_argument("--once", action="store_true",
                        help="scan FILEs once from the start, print counts, exit")
    parser.add_argument("--json", action="store_true", help="with --once: print one JSON object")
    return parser


def _scan_whole_file(scanner: Scanner, handle: BinaryIO, name: str, default_job: str) -> None:
    """Feed a file in chunks of whole lines, so a large log never has to fit in memory."""
    source = source_for(name, f"once:{name}", default_job)
    rest = b""
    while True:
        data = handle.read(_ONCE_CHUNK)
        if not data:
            break
        data = rest + data
        last = data.rfind(b"\n")
        if last < 0:
            if len(data) < _MAX_LINE:
                rest = data
                continue
            last = len(data) - 1  # a huge line without newline: feed it, as the follower does
        scanner.feed(source, data[:last + 1].decode("utf-8", "replace"))
        rest = data[last + 1:]
    if rest:
        scanner.feed(source, rest.decode("utf-8", "replace"))


def run_once(files: list[str], as_json: bool, default_job: str) -> int:
    scanner = Scanner()
    handles: list[tuple[str, BinaryIO]] = []
    try:
        for name in files:  # open everything first: all or nothing
            try:
                handles.append((name, open(name, "rb")))  # noqa: SIM115 - closed below
            except OSError as exc:
                print(f"{PROG}: cannot read {name}: {exc.strerror or exc}", file=sys.stderr)
                return 2
        for name, handle in handles:
            try:
                _scan_whole_file(scanner, handle, name, default_job)
            except OSError as exc:
                print(f"{PROG}: cannot read {name}: {exc.strerror or exc}", file=sys.stderr)
                return 2
    finally:
        for _name, handle in handles:
            handle.close()
    counts = scanner.counts_by_kind()
    if as_json:
        print(json.dumps({"counts": counts, "lines": scanner.lines}))
    else:
        for kind, count in counts.items():
            print(f"{kind:22s} {count}")
        print(f"{'lines':22s} {scanner.lines}")
    return 0


def serve(args: argparse.Namespace) -> int:
    try:
        state = load_state(args.state_file)
    except StateFileError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if args.state_file is not None and not args.state_file.parent.is_dir():
        print(f"{PROG}: state file directory {args.state_file.parent} does not exist",
              file=sys.stderr)
        return 2
    errors = {"count": 0}

    def on_error(path: str, exc: OSError) -> None:
        errors["count"] += 1
        print(f"{PROG}: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)

    scanner = Scanner()
    followers = [FileFollower(args.paths, state["files"], default_job=args.job,
                              on_error=on_error, on_open=scanner.register_source)]
    if args.kernel_log_file:
        kernel_state = state.setdefault("kernel_files", {})
        followers.append(FileFollower([args.kernel_log_file], kernel_state, kernel=True,
                                      on_error=on_error))
    kmsg = None
    if args.kernel_log:
        try:
            kmsg = KmsgReader(state.get("kmsg_seq"))
        except OSError as exc:
            print(f"{PROG}: cannot open {KMSG_PATH}: {exc.strerror or exc}", file=sys.stderr)
            return 2

    def sink(source: Source, text: str) -> None:
        scanner.feed(source, text)

    registry = CollectorRegistry()
    registry.register(ScannerCollector(
        scanner, lambda: sum(f.followed for f in followers), lambda: errors["count"]))
    try:
        server = serving.make_server(make_wsgi_app(registry), args.bind, args.port,
                                     ident=PROG, limits=serving.Limits(threads=2))
    except OSError as exc:
        print(f"{PROG}: cannot listen on {args.bind}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    http = serving.Background(server)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"{PROG}: serving on {args.bind}:{args.port}, following {args.paths}", file=sys.stderr)
    saved = ""
    try:
        while True:
            for follower in followers:
                follower.poll(sink)
            if kmsg is not None:
                kmsg.poll(sink)
                state["kmsg_seq"] = kmsg.last_seq
            if args.state_file is not None:
                snapshot = json.dumps(state, sort_keys=True)
                if snapshot != saved:  # an idle host should not fsync twice a second forever
                    try:
                        save_state(args.state_file, state)
                        saved = snapshot
                    except OSError as exc:  # disk full, read-only: keep serving, retry next poll
                        on_error(str(args.state_file), exc)
            if stop.wait(args.interval):
                break
    finally:
        http.stop()
        for follower in followers:
            follower.close()
        if kmsg is not None:
            kmsg.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.job = args.job or ""
    if args.once:
        if not args.paths:
            parser.error("--once needs at least one FILE")
        return run_once(args.paths, args.json, args.job)
    if args.json:
        parser.error("--json only applies to --once")
    if not args.paths and not (args.kernel_log or args.kernel_log_file):
        parser.error("give at least one PATH_OR_GLOB, --kernel-log or --kernel-log-file")
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
