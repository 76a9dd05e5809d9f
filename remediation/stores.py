"""Which store a config selects: SQLite (the single-host default) or PostgreSQL.

The PostgreSQL driver (psycopg, the `postgresql` extra) is imported only when a config asks
for it, so a single-host install does not need it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from trainwatch.remediation.config import Config, ConfigError
from trainwatch.remediation.store import ClockSkew, Store, existing_id


def _pgstore():  # type: ignore[no-untyped-def]
    try:
        from trainwatch.remediation import pgstore
    except ImportError as exc:
        raise ConfigError("store backend postgresql needs psycopg: install the 'postgresql' "
                          "extra (pip install 'trainwatch-gpu[postgresql]')") from exc
    return pgstore


def open_store(config: Config, *, clock: Callable[[], float] | None = None) -> Store:
    """The store the config names, its schema created if new. `clock`: this replica's wall
    clock (time.time; tests inject a wrong one), checked against the store's (StoreClock)."""
    if config.postgresql is not None:
        return _pgstore().PgStore(config.postgresql, clock=clock)  # type: ignore[no-any-return]
    return Store(config.store_path, max_bytes=config.store_max_bytes, clock=clock)


def existing_store_id(config: Config) -> str | None:
    """The id of the configured store without creating anything; None if it has none."""
    if config.postgresql is not None:
        return _pgstore().existing_id(config.postgresql)  # type: ignore[no-any-return]
    return existing_id(config.store_path)


def store_errors(config: Config) -> tuple[type[BaseException], ...]:
    """What opening the configured store raises when the store itself is the problem (or this
    replica's clock, which it refuses: ClockSkew)."""
    if config.postgresql is not None:
        import psycopg
        return (sqlite3.Error, psycopg.Error, ClockSkew)
    return (sqlite3.Error, ClockSkew)
