"""PostgreSQL store: the same Store, for remediation replicas on several hosts.

Everything above the connection is Store's own code and SQL (trainwatch.remediation.store); this
module
holds only what PostgreSQL spells differently: the schema (identity columns, double precision
times, PL/pgSQL triggers for the append-only audit, the retention horizon and the running
counters), `?` placeholders translated to psycopg's `%s`, rows readable by position and by
name (as sqlite3.Row), and the write lock.

The write lock: SQLite's BEGIN IMMEDIATE makes every write transaction exclusive, which is what
makes check-then-act atomic (claims, cooldowns, rate limits, the breaker). Here every write
transaction takes one transaction-scoped advisory lock first, so the same code keeps the same
guarantee across hosts; a replica that dies holding it (kill -9, a lost host) releases it when
the server notices the connection is gone. Reads run in autocommit and never wait on it.

The clock: the statement that takes the lock also reads the server's clock_timestamp(), the
transaction's `now` (trainwatch.remediation.store.StoreClock): every replica's grants, windows,
audit rows and retention horizon come from the database's clock, and a replica whose own clock
is off it beyond the tolerance writes nothing.

Durability: synchronous_commit stays on for every commit (the server's default), so a 2xx is
sent only after the intent's commit reached the server's WAL on disk. A server restart breaks
every open connection: the next transaction on a broken connection reconnects once before it
starts (nothing was done on it yet), and one that was cut mid-way fails as a whole (intake
answers 5xx and Alertmanager resends; a worker gives the intent back).

The password comes from a file (config `store.password_file`) and is handed to libpq as a
connection parameter in memory: never in argv, the environment, a DSN in the logs or repr().
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import psycopg

from trainwatch.remediation.schema import POSTGRES_TYPES, added_columns, tables, terminal_list
from trainwatch.remediation.store import (
    TERMINAL_STATES,
    LeaseWatch,
    Store,
    StoreClock,
    StoreGone,
    Transaction,
)

if TYPE_CHECKING:
    from trainwatch.remediation.config import PgSettings

# Any fixed 64-bit number; every Trainwatch store in one database shares it (one store per db).
WRITE_LOCK = 7_461_100_214

# The tables (trainwatch.remediation.schema) and what only PostgreSQL spells this way: PL/pgSQL
# triggers.
SCHEMA = tables(POSTGRES_TYPES) + "".join(
    f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {definition};\n"
    for table, column, definition in added_columns(POSTGRES_TYPES)) + """
INSERT INTO retention (id, horizon) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
CREATE OR REPLACE FUNCTION trainwatch_audit_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP <> 'DELETE' THEN
    RAISE EXCEPTION 'audit is append-only';
  END IF;
  IF OLD.at >= (SELECT horizon FROM retention WHERE id = 1)
     OR OLD.intent_id IN (SELECT id FROM intents WHERE state NOT IN (TERMINAL)) THEN
    RAISE EXCEPTION 'audit is append-only (only finished records past retention go)';
  END IF;
  RETURN OLD;
END $$;
CREATE OR REPLACE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit
  FOR EACH ROW EXECUTE FUNCTION trainwatch_audit_guard();
CREATE OR REPLACE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
  FOR EACH STATEMENT EXECUTE FUNCTION trainwatch_audit_guard();
CREATE OR REPLACE FUNCTION trainwatch_retention_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.horizon < OLD.horizon THEN
    RAISE EXCEPTION 'the retention horizon only moves forward';
  END IF;
  RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER retention_forward BEFORE UPDATE ON retention
  FOR EACH ROW EXECUTE FUNCTION trainwatch_retention_forward();
CREATE OR REPLACE FUNCTION trainwatch_audit_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO counters (kind, key, value) VALUES ('decision', NEW.decision, 1)
    ON CONFLICT (kind, key) DO UPDATE SET value = counters.value + 1;
  IF NEW.decision IN ('acted', 'failed') THEN
    INSERT INTO counters (kind, key, value)
      VALUES ('action', json_build_array(coalesce(NEW.playbook, ''), coalesce(NEW.action, ''),
                                         NEW.decision)::text, 1)
      ON CONFLICT (kind, key) DO UPDATE SET value = counters.value + 1;
  END IF;
  RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER audit_counts AFTER INSERT ON audit
  FOR EACH ROW EXECUTE FUNCTION trainwatch_audit_counts();
INSERT INTO meta (key, value) VALUES ('counters_seeded', '1') ON CONFLICT (key) DO NOTHING;
INSERT INTO meta (key, value) VALUES ('store_id', replace(gen_random_uuid()::text, '-', ''))
  ON CONFLICT (key) DO NOTHING;
""".replace("TERMINAL", terminal_list(TERMINAL_STATES))


class Row(Sequence[Any]):
    """A result row readable as row[0], row["name"] and dict(row), like sqlite3.Row."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: Sequence[Any], index: dict[str, int]) -> None:
        self._values = tuple(values)
        self._index = index

    def __getitem__(self, key: Any) -> Any:
        return self._values[self._index[key] if isinstance(key, str) else key]

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[str]:
        return list(self._index)


def _row_factory(cursor: Any) -> Any:
    index = {col.name: i for i, col in enumerate(cursor.description or ())}
    return lambda values: Row(values, index)


class Connection:
    """A psycopg connection that takes Store's SQL: `?` placeholders, execute() -> cursor."""

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        if params is None:
            return self.raw.execute(sql)  # type: ignore[call-overload]
        return self.raw.execute(sql.replace("%", "%%").replace("?", "%s"),  # type: ignore[call-overload]
                                tuple(params))

    @property
    def usable(self) -> bool:
        return not (self.raw.closed or self.raw.broken)

    def close(self) -> None:
        self.raw.close()


def connect(settings: PgSettings) -> Connection:
    """One autocommit connection (transactions are explicit BEGIN/COMMIT, as on SQLite)."""
    raw = psycopg.connect(
        host=settings.host, port=settings.port, dbname=settings.dbname, user=settings.user,
        password=settings.password, sslmode=settings.sslmode,
        connect_timeout=settings.connect_timeout, application_name="trainwatch-remediation",
        # a lock held longer than SQLite's busy timeout fails the same way, not forever
        options="-c lock_timeout=30s", autocommit=True, row_factory=_row_factory)
    return Connection(raw)


def existing_id(settings: PgSettings) -> str | None:
    """The store id in the database without creating or changing anything; None when the
    database has no Trainwatch tables (new or reset)."""
    conn = connect(settings)
    try:
        if conn.execute("SELECT to_regclass('meta')").fetchone()[0] is None:
            return None
        row = conn.execute("SELECT value FROM meta WHERE key='store_id'").fetchone()
    finally:
        conn.close()
    return str(row[0]) if row else None


class StoreReplaced(StoreGone, psycopg.OperationalError):
    """The database at the configured location is not the store this service opened."""


class PgStore(Store):
    """Store on PostgreSQL: one connection per thread, explicit transactions, one write lock."""

    GREATEST = "greatest"

    def __init__(self, settings: PgSettings, *, clock: Callable[[], float] | None = None) -> None:
        self.settings = settings
        self.clock = StoreClock(clock)  # this replica's clock, checked against the server's
        self.path = None
        self.max_bytes = None  # the server's own quota, not ours, bounds its disk use
        self._local = threading.local()
        self._leases = LeaseWatch()
        self._store_id: str | None = None
        with self.transaction() as tx:  # replicas starting together create it once
            tx.execute(SCHEMA)
        self._store_id = self.store_id()

    def _conn(self) -> Connection:  # type: ignore[override]
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None or not conn.usable:
            if conn is not None:
                with suppress(Exception):
                    conn.close()
            self._local.conn = None
            conn = connect(self.settings)
            try:
                self._check_identity(conn)
            except BaseException:
                conn.close()
                raise
            self._local.conn = conn
        return conn

    def _check_identity(self, conn: Connection) -> None:
        """Every new connection (a new thread, a reconnect after the server restarted) must
        reach the store this service opened: a database dropped and re-created, or another
        store restored under the same name while the service ran, would otherwise be written
        to as if it knew which alerts were acted on (the SQLite analogue: check_file)."""
        if self._store_id is None:
            return
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='store_id'").fetchone()
        except psycopg.errors.UndefinedTable:
            row = None
        found = str(row[0]) if row else None
        if found != self._store_id:
            raise StoreReplaced(
                f"database {self.settings.host}:{self.settings.port}/{self.settings.dbname} is "
                f"no longer the store this service opened (store id {self._store_id}, found "
                f"{found or 'no store'}): it was dropped, re-created or restored while the "
                "service ran; nothing is recorded until the service is restarted")

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """BEGIN, then the store-wide write lock (see the module docstring)."""
        conn = self._conn()
        try:
            conn.execute("BEGIN")
        except psycopg.OperationalError:
            if conn.usable:
                raise
            conn = self._conn()  # the server restarted since this thread's last use
            conn.execute("BEGIN")
        try:
            # the server's clock once the lock is held (the subquery runs first)
            db_now = conn.execute("SELECT extract(epoch FROM clock_timestamp())"
                                  " FROM (SELECT pg_advisory_xact_lock(?)) AS locked",
                                  (WRITE_LOCK,)).fetchone()[0]
            yield Transaction(conn, self.GREATEST, self.clock.database_time(float(db_now)))
        except BaseException:
            if conn.usable:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def quick_check(self) -> str:
        """PostgreSQL checks its own pages (data checksums) and refuses damaged ones on read;
        here: the store's tables answer."""
        self._conn().execute("SELECT count(*) FROM meta").fetchone()
        return "ok"

    def checkpoint(self) -> None:
        """Nothing to fold: a committed row is in the server's WAL and survives a restart."""

    @staticmethod
    def is_storage_failure(exc: BaseException) -> bool:
        """Connection lost, server shutting down, disk full, lock timeout (OperationalError),
        or an internal server error: not the alert's fault."""
        return isinstance(exc, psycopg.OperationalError | psycopg.errors.InternalError) or \
            Store.is_storage_failure(exc)
