"""The node exporter's durable command log: commands and per-rank outcomes survive a restart.

A command answered 202 must not vanish when the exporter restarts before any rank polled it,
and a command some rank already applied must still say so afterwards (so a re-post answers
"applied" instead of offering it again). So the store writes every accepted command here
before it answers, and every change of a rank's outcome when it learns one; on start it reads
them back. SQLite in WAL mode with synchronous=FULL: a committed row survives a power cut,
and one file per node is all the state there is.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from trainwatch.exporters.contract import commands as cmd

SCHEMA = """
CREATE TABLE IF NOT EXISTS commands (
    job TEXT NOT NULL, id TEXT NOT NULL, type TEXT NOT NULL, args TEXT NOT NULL,
    origin TEXT NOT NULL, created REAL NOT NULL, seq INTEGER PRIMARY KEY AUTOINCREMENT,
    UNIQUE (job, id));
CREATE TABLE IF NOT EXISTS outcomes (
    job TEXT NOT NULL, id TEXT NOT NULL, rank INTEGER NOT NULL, status TEXT NOT NULL,
    PRIMARY KEY (job, id, rank));
CREATE TABLE IF NOT EXISTS closed (
    job TEXT NOT NULL, id TEXT NOT NULL, reason TEXT NOT NULL, PRIMARY KEY (job, id));
"""
# A log written before the `closed` table existed gains it at the next start (IF NOT EXISTS).
Loaded = tuple[cmd.Command, str, float, dict[int, dict[str, Any]], str | None]


class CommandLog:
    """Append commands, upsert outcomes, read everything back at start. Thread-safe."""

    def __init__(self, path: str | Path, keep_per_job: int = 1000) -> None:
        self.path = Path(path)
        self._keep = keep_per_job
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.path.chmod(0o600)  # command args may name things an operator considers private
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def add(self, job: str, command: cmd.Command, origin: str, created: float) -> None:
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR IGNORE INTO commands (job, id, type, args, origin, created) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (job, command.id, command.type, json.dumps(command.args), origin, created))
            self._db.execute(  # bounded like the in-memory store
                "DELETE FROM commands WHERE job = ? AND seq NOT IN (SELECT seq FROM commands "
                "WHERE job = ? ORDER BY seq DESC LIMIT ?)", (job, job, self._keep))

    def outcome(self, job: str, command_id: str, rank: int, status: dict[str, Any]) -> None:
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO outcomes (job, id, rank, status) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (job, id, rank) DO UPDATE SET status = excluded.status",
                (job, command_id, rank, json.dumps(status)))

    def close_command(self, job: str, command_id: str, reason: str) -> None:
        """The command will never be applied (its launch finished first): after a restart of
        the exporter it must still be offered to no rank."""
        with self._lock, self._db:
            self._db.execute("INSERT OR IGNORE INTO closed (job, id, reason) VALUES (?, ?, ?)",
                             (job, command_id, reason))

    def load(self) -> dict[str, list[Loaded]]:
        """Every job's commands, oldest first, with their per-rank outcomes and, for a closed
        command, why."""
        with self._lock:
            rows = self._db.execute(
                "SELECT job, id, type, args, origin, created FROM commands ORDER BY seq"
            ).fetchall()
            outcomes: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
            for job, command_id, rank, status in self._db.execute(
                    "SELECT job, id, rank, status FROM outcomes"):
                outcomes.setdefault((job, command_id), {})[int(rank)] = json.loads(status)
            closed = {(job, command_id): reason for job, command_id, reason
                      in self._db.execute("SELECT job, id, reason FROM closed")}
        jobs: dict[str, list[Loaded]] = {}
        for job, command_id, command_type, args, origin, created in rows:
            jobs.setdefault(job, []).append(
                (cmd.Command(command_id, command_type, json.loads(args)), origin, created,
                 outcomes.get((job, command_id), {}), closed.get((job, command_id))))
        return jobs

    def close(self) -> None:
        with self._lock:
            self._db.close()
