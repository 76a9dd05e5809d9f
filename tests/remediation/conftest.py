"""Fixtures: an in-process service (Flask test client + real worker threads + real SQLite), and
the store backends (`store_section`: SQLite, or a database in a throwaway PostgreSQL cluster)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.remediation.helpers import write_config, write_playbook
from tests.support.net import wait_until
from tests.support.postgres import PgCluster, server_bin
from trainwatch.remediation.app import create_app
from trainwatch.remediation.config import Config, load_config
from trainwatch.remediation.playbooks import load_playbooks
from trainwatch.remediation.store import Store
from trainwatch.remediation.stores import open_store
from trainwatch.remediation.worker import Worker


@dataclass
class Service:
    client: FlaskClient
    store: Store
    worker: Worker | None
    config: Config

    def audit(self, decision: str | None = None) -> list[dict[str, Any]]:
        return self.store.list_audit(100000, decision=decision)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until no intent is pending or running."""
        def idle() -> bool:
            states = self.store.state_counts()
            return not states.get("pending") and not states.get("running")
        wait_until(idle, timeout=timeout, what="all intents processed")


@contextmanager
def make_service(workdir: Path, playbooks: list[dict[str, Any]] | None = None, *,
                 start_worker: bool = True, clock: Callable[[], float] | None = None,
                 **overrides: Any) -> Iterator[Service]:
    """The service in-process; `clock` is its wall clock (a replica's wrong clock)."""
    if playbooks is not None:
        for doc in playbooks:
            write_playbook(workdir / "playbooks", doc)
        overrides["playbooks_dir"] = str(workdir / "playbooks")
    config = load_config(write_config(workdir, **overrides))
    store = open_store(config, clock=clock)
    books = load_playbooks(config.playbooks_dir)
    worker = Worker(config, store, books) if start_worker else None
    app = create_app(config, worker=worker, store=store, books=books)
    if worker:
        worker.start()
    try:
        yield Service(app.test_client(), store, worker, config)
    finally:
        if worker:
            worker.stop()


@pytest.fixture
def service_factory(tmp_path: Path) -> Callable[..., Any]:
    return lambda *args, **kw: make_service(tmp_path, *args, **kw)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One throwaway PostgreSQL server for the session (each test gets its own database)."""
    if server_bin() is None:
        pytest.fail("PostgreSQL server not installed: run scripts/setup.sh --tests")
    cluster = PgCluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_section(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """Config overrides selecting the store under test: {} (SQLite at store_path, the default)
    or {"store": {...}} naming a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return {}
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    return {"store": cluster.database(tmp_path / "pg")}
