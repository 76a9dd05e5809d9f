"""SQLite store, the single source of truth shared by every service process.

* intents: one row per (fingerprint, startsAt, playbook, phase); UNIQUE makes redelivery,
  HA-pair duplicates and two processes sharing the file harmless.
* audit: append-only (triggers refuse UPDATE/DELETE); every decision is a row.
* grants: one row per permission to act, the basis of cooldowns, rate limits and the breaker.

WAL with synchronous=FULL for intake: a 2xx is only sent after the intent's commit reached the
disk, so an accepted alert survives a power cut as well as a crash (NORMAL would survive a
process crash but could lose the last commits on power loss, which breaks the "persist, then
2xx" promise). Worker threads use NORMAL (`use_worker_durability`): their commits (claims,
decisions, step progress) survive any process crash, are made durable by the next intake
fsync of the shared WAL or a checkpoint, and on a power cut the worst case is re-running an
idempotent step. This halves the fsyncs competing with intake for the write lock.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS intents (
    id INTEGER PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    starts_at TEXT NOT NULL,
    playbook TEXT NOT NULL,
    phase TEXT NOT NULL CHECK (phase IN ('fire', 'resolve')),
    alertname TEXT NOT NULL,
    labels TEXT NOT NULL,
    annotations TEXT NOT NULL,
    target_key TEXT,
    state TEXT NOT NULL,
    decision TEXT,
    next_step INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    not_before REAL NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_until REAL,
    approved INTEGER NOT NULL DEFAULT 0,
    results TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    UNIQUE (fingerprint, starts_at, playbook, phase)
);
CREATE INDEX IF NOT EXISTS intents_claim ON intents (state, not_before);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    intent_id INTEGER,
    fingerprint TEXT,
    playbook TEXT,
    alertname TEXT,
    target_key TEXT,
    decision TEXT NOT NULL,
    action TEXT,
    reason TEXT,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS audit_intent ON audit (intent_id);
CREATE TRIGGER IF NOT EXISTS audit_append_only_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_append_only_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END;
CREATE TABLE IF NOT EXISTS grants (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    playbook TEXT NOT NULL,
    target_key TEXT NOT NULL,
    intent_id INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS grants_target ON grants (playbook, target_key, at);
CREATE INDEX IF NOT EXISTS grants_at ON grants (at);
"""

TERMINAL_STATES = ("done", "failed", "refused", "rejected")


@dataclass(frozen=True)
class NewIntent:
    fingerprint: str
    starts_at: str
    playbook: str
    phase: str
    alertname: str
    labels: dict[str, str]
    annotations: dict[str, str]
    target_key: str | None
    state: str = "pending"
    decision: str | None = None


@dataclass
class Intent:
    id: int
    fingerprint: str
    starts_at: str
    playbook: str
    phase: str
    alertname: str
    labels: dict[str, str]
    annotations: dict[str, str]
    target_key: str | None
    state: str
    decision: str | None
    next_step: int
    attempts: int
    approved: bool
    results: list[Any]
    lease_owner: str | None

    @property
    def idempotency_key(self) -> str:
        return f"{self.fingerprint}|{self.starts_at}|{self.playbook}|{self.phase}"

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Intent:
        return cls(
            id=row["id"], fingerprint=row["fingerprint"], starts_at=row["starts_at"],
            playbook=row["playbook"], phase=row["phase"], alertname=row["alertname"],
            labels=json.loads(row["labels"]), annotations=json.loads(row["annotations"]),
            target_key=row["target_key"], state=row["state"], decision=row["decision"],
            next_step=row["next_step"], attempts=row["attempts"], approved=bool(row["approved"]),
            results=json.loads(row["results"]), lease_owner=row["lease_owner"])


class Store:
    """Thread-safe access: one connection per thread, explicit transactions."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        conn = self._conn()
        conn.executescript(SCHEMA)
        for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            with contextlib.suppress(OSError):  # audit details may hold host names, stack dumps
                name.chmod(0o600)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                   check_same_thread=True)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            sync = "NORMAL" if getattr(self._local, "worker", False) else "FULL"
            conn.execute(f"PRAGMA synchronous={sync}")
            conn.execute("PRAGMA busy_timeout=30000")
            self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close this thread's connection (others close when their threads end)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def use_worker_durability(self) -> None:
        """Call first thing in a worker thread: its connection commits with synchronous=NORMAL."""
        if getattr(self._local, "conn", None) is not None:
            raise RuntimeError("use_worker_durability() must run before the thread's first query")
        self._local.worker = True

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE: take the write lock up front so check-then-act is atomic across
        processes (cooldown, rate limit, breaker and claims cannot race)."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def ping(self) -> bool:
        return self._conn().execute("SELECT 1").fetchone()[0] == 1

    # --- writes ---------------------------------------------------------------------------
    @staticmethod
    def audit(conn: sqlite3.Connection, decision: str, *, intent_id: int | None = None,
              fingerprint: str | None = None, playbook: str | None = None,
              alertname: str | None = None, target_key: str | None = None,
              action: str | None = None, reason: str | None = None,
              detail: Any = None) -> None:
        conn.execute(
            "INSERT INTO audit (at, intent_id, fingerprint, playbook, alertname, target_key,"
            " decision, action, reason, detail) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (time.time(), intent_id, fingerprint, playbook, alertname, target_key, decision,
             action, reason, json.dumps(detail) if detail is not None else None))

    @staticmethod
    def insert_intent(conn: sqlite3.Connection, new: NewIntent) -> int | None:
        """Insert unless the idempotency key exists; returns the new id or None (duplicate)."""
        now = time.time()
        cur = conn.execute(
            "INSERT OR IGNORE INTO intents (fingerprint, starts_at, playbook, phase, alertname,"
            " labels, annotations, target_key, state, decision, created_at, updated_at)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (new.fingerprint, new.starts_at, new.playbook, new.phase, new.alertname,
             json.dumps(new.labels), json.dumps(new.annotations), new.target_key, new.state,
             new.decision, now, now))
        return cur.lastrowid if cur.rowcount == 1 else None

    def claim(self, owner: str, lease_seconds: float) -> Intent | None:
        """Atomically take one runnable intent: pending and due, or running with an expired
        lease (its process died). Exactly one claimant wins, whatever the process."""
        now = time.time()
        with self.transaction() as conn:
            row = conn.execute(
                "UPDATE intents SET state='running', lease_owner=?, lease_until=?, updated_at=?"
                " WHERE id = (SELECT id FROM intents WHERE (state='pending' AND not_before<=?)"
                " OR (state='running' AND lease_until<?) ORDER BY id LIMIT 1)"
                " RETURNING *",
                (owner, now + lease_seconds, now, now, now)).fetchone()
        return Intent.from_row(row) if row else None

    def renew_leases(self, owner: str, lease_seconds: float) -> None:
        now = time.time()
        with self.transaction() as conn:
            conn.execute("UPDATE intents SET lease_until=? WHERE state='running' AND lease_owner=?",
                         (now + lease_seconds, owner))

    @staticmethod
    def owns(conn: sqlite3.Connection, intent_id: int, owner: str) -> bool:
        row = conn.execute("SELECT state, lease_owner FROM intents WHERE id=?",
                           (intent_id,)).fetchone()
        return bool(row) and row["state"] == "running" and row["lease_owner"] == owner

    @staticmethod
    def update_intent(conn: sqlite3.Connection, intent_id: int, **fields: Any) -> None:
        allowed = {"state", "decision", "next_step", "attempts", "not_before", "lease_owner",
                   "lease_until", "approved", "results"}
        assert set(fields) <= allowed, fields
        fields["updated_at"] = time.time()
        if "results" in fields:
            fields["results"] = json.dumps(fields["results"])
        cols = ", ".join(f"{k}=?" for k in fields)
        conn.execute(f"UPDATE intents SET {cols} WHERE id=?",  # noqa: S608 - fixed names
                     (*fields.values(), intent_id))

    # --- reads ----------------------------------------------------------------------------
    @staticmethod
    def grants_since(conn: sqlite3.Connection, since: float, playbook: str | None = None,
                     target_key: str | None = None) -> tuple[int, float | None]:
        """(count, newest time) of grants since `since`, globally or for one target."""
        if playbook is None:
            row = conn.execute("SELECT count(*), max(at) FROM grants WHERE at>=?",
                               (since,)).fetchone()
        else:
            row = conn.execute(
                "SELECT count(*), max(at) FROM grants WHERE playbook=? AND target_key=? AND at>=?",
                (playbook, target_key, since)).fetchone()
        return int(row[0]), row[1]

    def get_intent(self, intent_id: int) -> Intent | None:
        row = self._conn().execute("SELECT * FROM intents WHERE id=?", (intent_id,)).fetchone()
        return Intent.from_row(row) if row else None

    def fire_intent_acted(self, fingerprint: str, starts_at: str, playbook: str) -> bool:
        row = self._conn().execute(
            "SELECT 1 FROM intents WHERE fingerprint=? AND starts_at=? AND playbook=?"
            " AND phase='fire' AND decision='act' AND state='done'",
            (fingerprint, starts_at, playbook)).fetchone()
        return row is not None

    def list_intents(self, limit: int = 100, state: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM intents"
        args: tuple[Any, ...] = ()
        if state:
            sql += " WHERE state=?"
            args = (state,)
        sql += " ORDER BY id DESC LIMIT ?"
        rows = self._conn().execute(sql, (*args, limit)).fetchall()
        out = []
        for row in rows:
            item = dict(row)
            for key in ("labels", "annotations", "results"):
                item[key] = json.loads(item[key])
            out.append(item)
        return out

    def list_audit(self, limit: int = 100, intent_id: int | None = None,
                   decision: str | None = None) -> list[dict[str, Any]]:
        clauses, args = [], []
        if intent_id is not None:
            clauses.append("intent_id=?")
            args.append(intent_id)
        if decision:
            clauses.append("decision=?")
            args.append(decision)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._conn().execute(
            f"SELECT * FROM audit{where} ORDER BY id DESC LIMIT ?",  # noqa: S608 - fixed
            (*args, limit)).fetchall()
        out = []
        for row in rows:
            item = dict(row)
            item["detail"] = json.loads(item["detail"]) if item["detail"] else None
            out.append(item)
        return out

    def decision_counts(self) -> dict[str, int]:
        rows = self._conn().execute("SELECT decision, count(*) FROM audit GROUP BY decision")
        return {r[0]: int(r[1]) for r in rows}

    def action_counts(self) -> list[tuple[str, str, str, int]]:
        rows = self._conn().execute(
            "SELECT playbook, coalesce(action, ''), decision, count(*) FROM audit"
            " WHERE decision IN ('acted', 'failed') GROUP BY 1, 2, 3")
        return [(r[0] or "", r[1], r[2], int(r[3])) for r in rows]

    def state_counts(self) -> dict[str, int]:
        rows = self._conn().execute("SELECT state, count(*) FROM intents GROUP BY state")
        return {r[0]: int(r[1]) for r in rows}

    def oldest_pending_age(self) -> float:
        row = self._conn().execute(
            "SELECT min(created_at) FROM intents WHERE state IN ('pending','running')").fetchone()
        return time.time() - row[0] if row and row[0] else 0.0
