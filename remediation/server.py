"""`remediation-server --config FILE`: the app under gunicorn, with the worker threads inside
the gunicorn worker process (one process: the store is shared with any other instance through
SQLite, so running two servers on one store is also safe)."""

from __future__ import annotations

import argparse
import logging
import sqlite3
import sys
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication

from remediation.app import create_app
from remediation.config import Config, ConfigError, load_config
from remediation.playbooks import PlaybookError, load_playbooks
from remediation.store import Store
from remediation.worker import Worker

log = logging.getLogger("remediation.server")


class RemediationServer(BaseApplication):  # type: ignore[misc]
    def __init__(self, config: Config) -> None:
        self.config_obj = config
        super().__init__()

    def load_config(self) -> None:
        cfg = self.config_obj
        settings = {
            "bind": f"{cfg.bind}:{cfg.port}" if ":" not in cfg.bind else f"[{cfg.bind}]:{cfg.port}",
            "workers": 1,
            "worker_class": "gthread",
            "threads": cfg.http_threads,
            "timeout": 60,
            "graceful_timeout": 10,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "warning",
            "post_worker_init": _start_worker,
            "worker_exit": _stop_worker,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        cfg = self.config_obj
        store = Store(cfg.store_path)
        books = load_playbooks(cfg.playbooks_dir)
        worker = Worker(cfg, store, books)
        app = create_app(cfg, worker=worker, store=store, books=books)
        app.extensions["trainwatch_worker"] = worker
        return app


def _start_worker(gunicorn_worker: Any) -> None:
    gunicorn_worker.wsgi.extensions["trainwatch_worker"].start()


def _stop_worker(_server: Any, gunicorn_worker: Any) -> None:
    worker = getattr(gunicorn_worker, "wsgi", None)
    if worker is not None:
        worker.extensions["trainwatch_worker"].stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="remediation-server", description=__doc__)
    parser.add_argument("--config", required=True, type=Path, help="YAML config file")
    parser.add_argument("--bind", help="override the config's bind address")
    parser.add_argument("--port", type=int, help="override the config's port")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
        load_playbooks(config.playbooks_dir)  # fail before binding, with a clear message
        # Open (and create) the store here too: a bad store_path is a one-line error, not a
        # gunicorn worker that fails to boot. The worker opens its own after the fork.
        Store(config.store_path).close()
    except (ConfigError, PlaybookError) as exc:
        print(f"remediation-server: {exc}", file=sys.stderr)
        return 2
    except (OSError, sqlite3.Error) as exc:
        print(f"remediation-server: cannot open store {config.store_path}: {exc}",
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
        from dataclasses import replace

        config = replace(config, **overrides)
    RemediationServer(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
