"""`remediation-server --config FILE`: the app under trainwatch.exporters.contract.serving
(waitress), with the
worker threads that run actions in the same process (the store is shared with any other
instance through SQLite on one host or PostgreSQL across hosts, so running two servers on one
store is also safe). Why waitress, and the request and connection limits:
exporters/contract/serving.py.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainwatch.exporters import add_version_argument
from trainwatch.exporters.contract import serving
from trainwatch.remediation.app import create_app
from trainwatch.remediation.config import Config, ConfigError, load_config
from trainwatch.remediation.marker import StoreResetError, check_store, write_marker
from trainwatch.remediation.playbooks import PlaybookError, load_playbooks
from trainwatch.remediation.recovery import RecoveryTimes
from trainwatch.remediation.stores import open_store, store_errors
from trainwatch.remediation.worker import Worker

log = logging.getLogger("trainwatch.remediation.server")


def make_server(app: Any, config: Config) -> serving.Server:
    """The app's server, bound to the config's address, accepting once run() is called; HTTPS
    only when the config names a certificate and key."""
    tls = (serving.Tls(str(config.tls_cert_file), str(config.tls_key_file))
           if config.tls_cert_file is not None else None)
    return serving.make_server(app, config.bind, config.port, ident="trainwatch-remediation",
                               tls=tls,
                               limits=serving.Limits(
                                   threads=config.http_threads,
                                   max_connections=config.max_connections,
                                   request_timeout_seconds=config.request_timeout_seconds,
                                   idle_timeout_seconds=config.idle_timeout_seconds,
                                   max_body_bytes=config.max_body_bytes))


def serve(config: Config) -> None:
    store = open_store(config)
    books = load_playbooks(config.playbooks_dir)
    worker = Worker(config, store, books)
    app = create_app(config, worker=worker, store=store, books=books)
    worker.recovery = RecoveryTimes(app.extensions["trainwatch_remediation"].registry)
    server = make_server(app, config)
    worker.start()
    log.info("listening on %s:%d", config.bind, config.port)
    serving.serve_until_signal(server, on_stop=worker.stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="remediation-server", description=__doc__)
    add_version_argument(parser)
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
