"""The store, the single source of truth shared by every service process: SQLite here (the
single-host default), PostgreSQL in trainwatch.remediation.pgstore (replicas on several hosts).
Both run
the same SQL below; the few dialect differences are the schema and the class attributes and
methods PgStore overrides.

* intents: one row per (fingerprint, startsAt, playbook, phase); UNIQUE makes redelivery,
  HA-pair duplicates and two processes sharing the file harmless.
* audit: append-only (triggers refuse UPDATE/DELETE); every decision is a row.
* grants: one row per permission to act, the basis of cooldowns, rate limits and the breakers
  (each grant carries its playbook's priority: a breaker counts only grants at its priority
  or above, so low-value actions cannot keep a checkpoint rollback from running).
* counters: running totals kept by a trigger on every audit insert, so /metrics reads a few
  rows instead of scanning the audit table, and the totals survive audit retention.
* meta: the store's identity (a random id written once); the marker file kept outside the
  store (trainwatch.remediation.marker) names it, so a store that was reset is noticed at start.

Retention (`Store.prune`) deletes finished intents and audit rows older than the horizon;
the audit triggers still refuse any delete of a row newer than the horizon or belonging to an
intent that is not finished, so an unfinished intent never loses its history.

Nothing here trusts the wall clock for what a jump would break: leases are counters judged on
each observer's monotonic clock (LeaseWatch), and retention refuses a clock that jumped
(check_prune_clock) and moves its horizon by bounded steps. Every time the store records (an
intent's, an audit row's, a grant's, the retention horizon) and every window the rails read is
the transaction's `now`, read from one clock: the database's on PostgreSQL (every replica, one
clock), the host's on SQLite (one host); a replica whose own clock disagrees with it beyond
CLOCK_TOLERANCE writes nothing (ClockSkew), see StoreClock. Nor the filesystem: the SQLite file
opened must stay the file at its path (Store.check_file), or nothing is recorded.

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
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from trainwatch.remediation.schema import SQLITE_TYPES, added_columns, tables, terminal_list

log = logging.getLogger(__name__)

TERMINAL_STATES = ("done", "failed", "refused", "rejected", "cancelled")
# The tables (trainwatch.remediation.schema) and what only SQLite spells this way: the triggers
# that keep
# the audit append-only, the retention horizon forward-only and the running counters.
SCHEMA = tables(SQLITE_TYPES) + """
INSERT OR IGNORE INTO retention (id, horizon) VALUES (1, 0);
CREATE TRIGGER IF NOT EXISTS audit_append_only_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END;
DROP TRIGGER IF EXISTS audit_append_only_delete;
CREATE TRIGGER audit_append_only_delete BEFORE DELETE ON audit
WHEN old.at >= (SELECT horizon FROM retention WHERE id = 1)
  OR old.intent_id IN (SELECT id FROM intents WHERE state NOT IN (TERMINAL))
BEGIN SELECT RAISE(ABORT, 'audit is append-only (only finished records past retention go)');
END;
CREATE TRIGGER IF NOT EXISTS retention_forward BEFORE UPDATE ON retention
WHEN new.horizon < old.horizon
BEGIN SELECT RAISE(ABORT, 'the retention horizon only moves forward'); END;
CREATE TRIGGER IF NOT EXISTS audit_counts AFTER INSERT ON audit
BEGIN
  INSERT INTO counters (kind, key, value) VALUES ('decision', new.decision, 1)
    ON CONFLICT (kind, key) DO UPDATE SET value = value + 1;
  INSERT INTO counters (kind, key, value)
    SELECT 'action', json_array(coalesce(new.playbook, ''), coalesce(new.action, ''),
                                new.decision), 1
    WHERE new.decision IN ('acted', 'failed')
    ON CONFLICT (kind, key) DO UPDATE SET value = value + 1;
END;
""".replace("TERMINAL", terminal_list(TERMINAL_STATES))
PRIORITIES = {"low": 0, "normal": 1, "high": 2}
# What a Transaction runs its statements on: a sqlite3.Connection, or pgstore's connection
# (both answer execute(sql with ? placeholders, params) with a cursor of rows indexable by
# position and by column name).
Conn = Any


@dataclass(frozen=True)
class NewIntent:
    """An intent about to be stored: what intake knows of an alert and its playbook."""

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


@dataclass(frozen=True, kw_only=True)
class Intent(NewIntent):
    """A stored intent: NewIntent's fields plus its row id and progress (read-only: every
    change goes through the store)."""

    id: int
    next_step: int
    attempts: int
    approved: bool
    results: list[Any]
    lease_owner: str | None
    acted: bool = False
    lease_gen: int = 0  # the claim's fencing token (Store.claim, Store.owns)
    # 0, or until when an approval hold outlives its alert's resolve (an action's
    # `outlives_resolve`): a resolve neither cancels it nor its steps once approved
    hold_until: float = 0.0

    @property
    def idempotency_key(self) -> str:
        return f"{self.fingerprint}|{self.starts_at}|{self.playbook}|{self.phase}"

    @classmethod
    def from_row(cls, row: Any) -> Intent:
        return cls(
            id=row["id"], fingerprint=row["fingerprint"], starts_at=row["starts_at"],
            playbook=row["playbook"], phase=row["phase"], alertname=row["alertname"],
            labels=json.loads(row["labels"]), annotations=json.loads(row["annotations"]),
            target_key=row["target_key"], state=row["state"], decision=row["decision"],
            next_step=row["next_step"], attempts=row["attempts"], approved=bool(row["approved"]),
            results=json.loads(row["results"]), lease_owner=row["lease_owner"],
            acted=bool(row["acted"]), lease_gen=int(row["lease_gen"]),
            hold_until=float(row["hold_until"] or 0))


class LeaseWatch:
    """When a running intent's lease has expired, judged without comparing anybody's clock.

    A lease is (owner, generation, beat) in the intent's row: a claim bumps the generation
    (the fencing token the holder must present with every write: Store.owns), each renewal
    bumps the beat, and the row says how long the holder may go without renewing
    (lease_seconds). An observer (the claim of another worker, in any process on any host)
    notes when it first saw a (generation, beat) on its own monotonic clock, and takes the
    intent over only once it has seen that same pair for lease_seconds.

    Why not a wall-clock deadline in the row (as before): a wall clock jumps (an NTP step, a
    VM restored, an operator's date), and a jump ahead makes every live lease look expired,
    so a second worker runs a step that is still running. A monotonic clock does not jump,
    but one host's monotonic clock means nothing to another host (PostgreSQL replicas) or
    after a reboot, so no monotonic time is ever stored: each observer measures only its own
    elapsed time, and the row carries only counters. The database's clock (PostgreSQL's
    clock_timestamp()) would be one clock for all replicas, but it is a wall clock too and
    jumps the same way; SQLite has none. The price: a newly started observer waits one full
    lease before taking over a dead process's intent, as it did before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[int, tuple[Any, float]] = {}  # id -> (lease mark, first seen)

    def expired(self, running: list[Any], default_lease: float) -> list[int]:
        """The ids of `running` rows (id, lease_gen, lease_beat, lease_until, lease_seconds)
        whose lease this observer has seen unrenewed for at least their lease_seconds. A row
        claimed by an earlier release has no lease_seconds (`default_lease` then) and renews
        lease_until instead of the beat: a change of either counts as a renewal."""
        now = time.monotonic()
        out = []
        with self._lock:
            seen: dict[int, tuple[Any, float]] = {}
            for row in running:
                intent_id, lease = int(row[0]), row[4]
                mark = (row[1], row[2], row[3])
                first = self._seen.get(intent_id)
                if first is None or first[0] != mark:
                    first = (mark, now)
                elif now - first[1] >= (default_lease if lease is None else float(lease)):
                    out.append(intent_id)
                seen[intent_id] = first
            self._seen = seen
        return out


# Counters start from what the audit already holds when a store made before them is opened.
SEED = """
INSERT INTO counters (kind, key, value)
  SELECT 'decision', decision, count(*) FROM audit
  WHERE NOT EXISTS (SELECT 1 FROM meta WHERE key = 'counters_seeded') GROUP BY decision;
INSERT INTO counters (kind, key, value)
  SELECT 'action', json_array(coalesce(playbook, ''), coalesce(action, ''), decision), count(*)
  FROM audit WHERE decision IN ('acted', 'failed')
  AND NOT EXISTS (SELECT 1 FROM meta WHERE key = 'counters_seeded') GROUP BY 2;
INSERT OR IGNORE INTO meta (key, value) VALUES ('counters_seeded', '1');
INSERT OR IGNORE INTO meta (key, value) VALUES ('store_id', lower(hex(randomblob(16))));
"""


# How far the wall clock may disagree with the monotonic clock, or with times already recorded,
# before retention distrusts it (seconds, plus 0.1 % of the time elapsed: NTP slews by 0.05 %).
CLOCK_TOLERANCE = 120.0


# A host clock that was stepped and then ran steady against the monotonic clock for this long
# is taken as the host's clock again (SQLite: there is no other clock to ask).
CLOCK_SETTLE = 600.0


class ClockSuspect(RuntimeError):
    """The wall clock moved backwards or leapt ahead: retention refused to prune against it."""


class ClockSkew(ClockSuspect):
    """This replica's clock disagrees with the store's clock (the database's), or leapt against
    its own monotonic clock: the transaction was refused before it wrote anything."""


class StoreClock:
    """Where the time of the shared store comes from, and the rule a replica's clock must keep.

    On PostgreSQL the store's time is the database server's (clock_timestamp(), read in the
    statement that takes the write lock): grants, cooldown and rate windows, audit rows and the
    retention horizon of every replica come from one clock, so a replica whose clock runs 100
    days ahead can neither date a grant into the future (where it would count in every window)
    nor move retention past the others' rows. Its own clock still times what it does outside
    the store (retry backoffs, deferrals, the pager), so while it is more than CLOCK_TOLERANCE
    off the database's it writes nothing: every transaction raises ClockSkew, which intake
    answers 5xx (Alertmanager delivers to the other replicas), /readyz reports and the log says
    once.

    On SQLite (one host) the store's time is the host's clock, checked against the monotonic
    clock since the store opened: a clock that leaps ahead or back is refused the same way
    until it is back, or has run steady for CLOCK_SETTLE (an NTP step that stays)."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or (lambda: time.time())
        self._lock = threading.Lock()
        self._anchor = (self._clock(), time.monotonic())
        self._stepped_at: float | None = None
        self.problem: str | None = None

    def local(self) -> float:
        """This replica's own wall clock."""
        return self._clock()

    def host_time(self) -> float:
        """SQLite's `now`: the host's clock, or ClockSkew while it leapt (see the class)."""
        wall, mono = self._clock(), time.monotonic()
        with self._lock:
            elapsed = mono - self._anchor[1]
            drift = (wall - self._anchor[0]) - elapsed
            if abs(drift) <= CLOCK_TOLERANCE + 0.001 * elapsed:
                self._stepped_at = None
                return self._agree(wall)
            if self._stepped_at is None:
                self._stepped_at = mono
            if mono - self._stepped_at >= CLOCK_SETTLE:
                log.warning("the wall clock moved %+.0f s and stayed there for %.0f s: "
                            "taking it as the host's clock", drift, CLOCK_SETTLE)
                self._anchor, self._stepped_at = (wall, mono), None
                return self._agree(wall)
            return self._refuse(
                f"the wall clock moved {drift:+.0f} s against the monotonic clock since the "
                f"store opened ({elapsed:.0f} s ago): nothing is written until it is back, or "
                f"has stayed there for {CLOCK_SETTLE:.0f} s")

    def database_time(self, db_now: float) -> float:
        """PostgreSQL's `now`: the database's clock, or ClockSkew while this replica's clock
        is more than CLOCK_TOLERANCE off it."""
        skew = self._clock() - db_now
        with self._lock:
            if abs(skew) <= CLOCK_TOLERANCE:
                return self._agree(db_now)
            return self._refuse(
                f"this replica's clock is {skew:+.0f} s off the database server's (tolerance "
                f"{CLOCK_TOLERANCE:.0f} s): it writes nothing to the shared store until NTP "
                "brings them together")

    def _agree(self, now: float) -> float:
        if self.problem is not None:
            log.warning("clock agrees with the store's again: writing resumes")
            self.problem = None
        return now

    def _refuse(self, problem: str) -> float:
        if self.problem is None:
            log.error("%s", problem)
        self.problem = problem
        raise ClockSkew(problem)


def _boot_id() -> str:
    """This boot of this host: monotonic readings compare only within one."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def check_prune_clock(now: float, mono: float, boot: str, previous: dict[str, Any] | None,
                      newest: float | None) -> str | None:
    """Why the wall clock `now` is not to be pruned against, or None. `previous` is the last
    prune's {wall, mono, boot}; `newest` the newest time recorded in the store."""
    if newest is not None and now < newest - CLOCK_TOLERANCE:
        return (f"the clock reads {now - newest:.0f} s before the newest recorded time: it "
                "moved backwards")
    if not previous:
        return None
    if now < float(previous["wall"]) - CLOCK_TOLERANCE:
        return (f"the clock reads {now - float(previous['wall']):.0f} s before the previous "
                "prune: it moved backwards")
    if previous.get("boot") == boot and boot:
        elapsed = mono - float(previous["mono"])
        drift = (now - float(previous["wall"])) - elapsed
        if abs(drift) > CLOCK_TOLERANCE + 0.001 * elapsed:
            return (f"since the previous prune the wall clock moved {drift:+.0f} s against the "
                    f"monotonic clock ({elapsed:.0f} s elapsed): it "
                    + ("leapt ahead" if drift > 0 else "moved backwards"))
    return None


class StoreGone(Exception):
    """The store this service opened is no longer the store at its location (a SQLite file
    deleted or replaced; a PostgreSQL database dropped, re-created or restored): a storage
    failure that only a restart clears, which then meets the marker check."""


class StoreFileGone(StoreGone, sqlite3.OperationalError):
    """The store file this service opened is no longer the file at its path (deleted, or
    replaced by another file): a write now would go to an unlinked file and be lost, or to a
    store that does not know which alerts were acted on. A storage failure like a full disk
    (intake answers 5xx, /readyz fails), never cleared by this process: restart it (it then
    refuses a missing or replaced store with a message saying how to restore or accept it)."""


def _identity(path: Path) -> tuple[int, int]:
    """(device, inode) of the file now at `path`; StoreFileGone when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise StoreFileGone(f"store file {path} was deleted while the service ran; nothing "
                            "is recorded until the service is restarted (restore the file "
                            "first, or restart with --accept-new-store for a new one)") from None
    return st.st_dev, st.st_ino


def existing_id(path: Path) -> str | None:
    """The store id in the SQLite file at `path` without creating or changing anything; None
    when there is no file, an empty one, or one that is not a readable store."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        conn = sqlite3.connect(path, timeout=30.0)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='store_id'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return str(row[0]) if row else None


def _migrate(conn: sqlite3.Connection) -> None:
    """Add the columns a store made by an older release lacks (before SCHEMA's indexes and
    triggers refer to them)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, column, definition in added_columns(SQLITE_TYPES):
            names = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
            if names and column not in names:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
                if column == "acted":  # granted before the column existed
                    conn.execute("UPDATE intents SET acted=1 WHERE decision IN"
                                 " ('act', 'resolve_act')")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@dataclass(frozen=True)
class Seen:
    """An intent as a transaction sees it (Transaction.look): its row, and whether the same
    alert's resolve has been recorded (its firing steps not yet run never will be)."""

    intent: Intent
    resolved: bool

    def held_by(self, owner: str, lease_gen: int) -> bool:
        """Whether `owner` still holds the lease of the claim that gave it `lease_gen`."""
        return (self.intent.state == "running" and self.intent.lease_owner == owner
                and self.intent.lease_gen == lease_gen)


@dataclass(frozen=True)
class GrantCounts:
    """What the engine's rails read of the grants, in one statement (Transaction.grant_counts):
    the newest grant of the target since the cooldown began, the target's grants in the rate
    window, and the grants at the breaker's priority or above in its window."""

    last: float | None
    in_rate_window: int
    in_breaker_window: int




@dataclass(frozen=True)
class GrantRow:
    """One grant as an action's rails read it (Transaction.grant_history)."""

    target_key: str
    at: float
    intent_id: int
    ended_at: float | None
    intent_state: str | None  # None once retention removed the intent

    @property
    def holds(self) -> bool:
        """Still holding: not ended, and its intent neither failed nor was cancelled or
        refused (its steps did or may still do what was granted)."""
        return self.ended_at is None and self.intent_state not in (
            "failed", "cancelled", "refused", "rejected")


def _resolved(row: str) -> str:
    """SQL: the resolve of the same alert and playbook as the intents row `row` is recorded."""
    return (f"EXISTS (SELECT 1 FROM intents r WHERE r.fingerprint = {row}.fingerprint"  # noqa: S608
            f" AND r.starts_at = {row}.starts_at AND r.playbook = {row}.playbook"
            " AND r.phase = 'resolve')")


SAVEPOINT_NAMES = frozenset({"part", "alert", "delivery"})
UPDATABLE = frozenset({"state", "decision", "next_step", "attempts", "not_before", "lease_owner",
                       "lease_until", "approved", "results", "acted", "hold_until"})


class Transaction:
    """One write transaction of the store (Store.transaction): every statement made inside
    one, each a method, so no caller outside the store modules holds a connection or writes
    SQL (tests/remediation/test_store_owns_sql.py). The same code runs on SQLite and on
    PostgreSQL (pgstore's connection takes `?` placeholders and answers rows like
    sqlite3.Row); `greatest` is the one function the two spell differently. `now` is the
    store's time for everything the transaction records and every window it reads (StoreClock:
    the database's clock on PostgreSQL)."""

    def __init__(self, conn: Conn, greatest: str, now: float) -> None:
        self._conn = conn
        self._greatest = greatest
        self.now = now

    def execute(self, sql: str, params: Any = ()) -> Any:
        """Raw SQL in this transaction: for the store modules, and for tests that check what
        the schema refuses (an edited audit row, a horizon moved back)."""
        return self._conn.execute(sql, params)

    @contextmanager
    def savepoint(self, name: str) -> Iterator[None]:
        """Undo what the block did if it raises (the exception goes on), keep it otherwise:
        one payload, part or alert recorded or not, the transaction going on either way."""
        if name not in SAVEPOINT_NAMES:
            raise ValueError(f"savepoint name {name!r} not in {sorted(SAVEPOINT_NAMES)}")
        self._conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self._conn.execute(f"ROLLBACK TO {name}")
            self._conn.execute(f"RELEASE {name}")
            raise
        self._conn.execute(f"RELEASE {name}")

    # --- intents --------------------------------------------------------------------------
    def insert_intent(self, new: NewIntent) -> int | None:
        """Insert unless the idempotency key exists; returns the new id or None (duplicate)."""
        now = self.now
        row = self._conn.execute(
            "INSERT INTO intents (fingerprint, starts_at, playbook, phase, alertname,"
            " labels, annotations, target_key, state, decision, created_at, updated_at)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT (fingerprint, starts_at, playbook, phase) DO NOTHING RETURNING id",
            (new.fingerprint, new.starts_at, new.playbook, new.phase, new.alertname,
             json.dumps(new.labels), json.dumps(new.annotations), new.target_key, new.state,
             new.decision, now, now)).fetchone()
        return int(row[0]) if row else None

    def intent(self, intent_id: int) -> Intent | None:
        row = self._conn.execute("SELECT * FROM intents WHERE id=?", (intent_id,)).fetchone()
        return Intent.from_row(row) if row else None

    def partner(self, intent: NewIntent, phase: str) -> Intent | None:
        """The intent of the other `phase` of the same alert and playbook (fire <-> resolve)."""
        row = self._conn.execute(
            "SELECT * FROM intents WHERE fingerprint=? AND starts_at=? AND playbook=? AND phase=?",
            (intent.fingerprint, intent.starts_at, intent.playbook, phase)).fetchone()
        return Intent.from_row(row) if row else None

    def recent_firing_intents(self, playbook: str, target_key: str, since: float,
                              limit: int = 20) -> list[Any]:
        """The firing intents of one playbook on one target created since `since`, newest
        first: the quarantine of a stalled job reads the results of the job's diagnostics
        intent (trainwatch.remediation.actions.quarantine), which another alert of the same stall
        may
        have created."""
        return list(self._conn.execute(
            "SELECT * FROM intents WHERE playbook=? AND target_key=? AND phase='fire'"
            " AND created_at>=? ORDER BY id DESC LIMIT ?",
            (playbook, target_key, since, limit)).fetchall())

    def look(self, intent_id: int) -> Seen | None:
        """The intent and whether its alert's resolve is recorded, in one statement."""
        row = self._conn.execute(
            f"SELECT i.*, {_resolved('i')} AS resolved FROM intents i WHERE i.id=?",  # noqa: S608
            (intent_id,)).fetchone()
        return Seen(Intent.from_row(row), bool(row["resolved"])) if row else None

    def update_intent(self, intent_id: int, **fields: Any) -> None:
        self._update("WHERE id=?", (intent_id,), fields)

    def update_held(self, intent: Intent, owner: str, *, unless_resolved: bool = False,
                    **fields: Any) -> bool:
        """Update `intent` only while `owner` holds the lease of the claim that returned it
        (and, with `unless_resolved`, while its alert's resolve is not recorded), in one
        statement: False when it changed nothing (Transaction.look says why)."""
        where = ("WHERE id=? AND state='running' AND lease_owner=? AND lease_gen=?"
                 + (f" AND NOT {_resolved('intents')}" if unless_resolved else ""))
        return self._update(where, (intent.id, owner, intent.lease_gen), fields) == 1

    def _update(self, where: str, args: tuple[Any, ...], fields: dict[str, Any]) -> int:
        if not set(fields) <= UPDATABLE:
            raise ValueError(f"not updatable: {sorted(set(fields) - UPDATABLE)}")
        fields["updated_at"] = self.now
        if "results" in fields:
            fields["results"] = json.dumps(fields["results"])
        cols = ", ".join(f"{k}=?" for k in fields)
        return int(self._conn.execute(f"UPDATE intents SET {cols} {where}",  # noqa: S608 - fixed names
                                      (*fields.values(), *args)).rowcount)

    # --- audit ----------------------------------------------------------------------------
    def audit(self, decision: str, *, intent_id: int | None = None,
              fingerprint: str | None = None, playbook: str | None = None,
              alertname: str | None = None, target_key: str | None = None,
              action: str | None = None, reason: str | None = None, detail: Any = None) -> None:
        self._conn.execute(
            "INSERT INTO audit (at, intent_id, fingerprint, playbook, alertname, target_key,"
            " decision, action, reason, detail) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (self.now, intent_id, fingerprint, playbook, alertname, target_key, decision,
             action, reason, json.dumps(detail) if detail is not None else None))

    def audit_duplicate(self, new: NewIntent, reason: str) -> None:
        """Audit a delivery of an intent already recorded, on that intent's row (found in the
        same statement)."""
        self._conn.execute(
            "INSERT INTO audit (at, intent_id, fingerprint, playbook, alertname, target_key,"
            " decision, reason) VALUES (?, (SELECT id FROM intents WHERE fingerprint=?"
            " AND starts_at=? AND playbook=? AND phase=?), ?,?,?,?,'deduplicated',?)",
            (self.now, new.fingerprint, new.starts_at, new.playbook, new.phase,
             new.fingerprint, new.playbook, new.alertname, new.target_key, reason))

    # --- grants ---------------------------------------------------------------------------
    def grant_counts(self, playbook: str, target_key: str, *, cooldown_since: float | None,
                     rate_since: float | None, breaker_since: float | None,
                     min_priority: int) -> GrantCounts:
        """The rails' reads in one statement; a window that is None is not read (0, None)."""
        row = self._conn.execute(
            "SELECT (SELECT max(at) FROM grants WHERE playbook=? AND target_key=? AND at>=?),"
            " (SELECT count(*) FROM grants WHERE playbook=? AND target_key=? AND at>=?),"
            " (SELECT count(*) FROM grants WHERE at>=? AND priority>=?)",
            (playbook, target_key, cooldown_since, playbook, target_key, rate_since,
             breaker_since, min_priority)).fetchone()
        return GrantCounts(row[0], int(row[1]), int(row[2]))

    def grants_since(self, since: float, playbook: str | None = None,
                     target_key: str | None = None, *, min_priority: int = 0
                     ) -> tuple[int, float | None]:
        """(count, newest time) of grants since `since`: for one target, or (breakers) of
        every playbook at `min_priority` or above."""
        if playbook is None:
            row = self._conn.execute(
                "SELECT count(*), max(at) FROM grants WHERE at>=? AND priority>=?",
                (since, min_priority)).fetchone()
        else:
            row = self._conn.execute(
                "SELECT count(*), max(at) FROM grants WHERE playbook=? AND target_key=? AND at>=?",
                (playbook, target_key, since)).fetchone()
        return int(row[0]), row[1]

    def add_grant(self, at: float, playbook: str, target_key: str, intent_id: int,
                  priority: int) -> None:
        self._conn.execute("INSERT INTO grants (at, playbook, target_key, intent_id, priority)"
                           " VALUES (?,?,?,?,?)", (at, playbook, target_key, intent_id, priority))

    def grant_targets(self, playbook: str, since: float) -> list[str]:
        """The distinct targets `playbook` was granted on since `since`, sorted."""
        rows = self._conn.execute(
            "SELECT DISTINCT target_key FROM grants WHERE playbook=? AND at>=?",
            (playbook, since)).fetchall()
        return sorted(str(row[0]) for row in rows)

    def grant_history(self, playbook: str, since: float,
                      target_key: str | None = None) -> list[GrantRow]:
        """`playbook`'s grants since `since` (on one target, or all), oldest first, each with
        its intent's state: what an action's rails read of what it was granted before."""
        where = "g.playbook=? AND g.at>=?" + (" AND g.target_key=?" if target_key else "")
        args = (playbook, since, target_key) if target_key else (playbook, since)
        rows = self._conn.execute(
            "SELECT g.target_key, g.at, g.intent_id, g.ended_at, i.state FROM grants g"  # noqa: S608
            f" LEFT JOIN intents i ON i.id = g.intent_id WHERE {where} ORDER BY g.at, g.id",
            args).fetchall()
        return [GrantRow(str(r[0]), float(r[1]), int(r[2]),
                         float(r[3]) if r[3] is not None else None, r[4]) for r in rows]

    def end_grants(self, playbook: str, at: float, *, target_key: str | None = None,
                   intent_id: int | None = None) -> int:
        """Mark `playbook`'s open grants on a target (or of an intent) ended at `at`: they
        stay in the history (a count of faults) but no longer hold anything."""
        if (target_key is None) == (intent_id is None):
            raise ValueError("end_grants: one of target_key or intent_id")
        column, value = ("target_key", target_key) if target_key is not None \
            else ("intent_id", intent_id)
        return int(self._conn.execute(
            f"UPDATE grants SET ended_at=? WHERE playbook=? AND {column}=?"  # noqa: S608
            " AND ended_at IS NULL", (at, playbook, value)).rowcount)

    def latest_audit_detail(self, intent_id: int, decision: str) -> dict[str, Any] | None:
        """The detail of an intent's newest audit row with `decision` (None without one)."""
        row = self._conn.execute(
            "SELECT detail FROM audit WHERE intent_id=? AND decision=? ORDER BY id DESC"
            " LIMIT 1", (intent_id, decision)).fetchone()
        if row is None or row[0] is None:
            return None
        detail = json.loads(row[0])
        return detail if isinstance(detail, dict) else None

    def expire_holds(self, now: float) -> list[Intent]:
        """The intents awaiting approval whose hold ran out (`hold_until` passed): cancelled,
        decision `expired`, returned for the caller to audit and page."""
        rows = self._conn.execute(
            "UPDATE intents SET state='cancelled', decision='expired', updated_at=?"
            " WHERE state='awaiting_approval' AND hold_until > 0 AND hold_until < ?"
            " RETURNING *", (now, now)).fetchall()
        return [Intent.from_row(r) for r in rows]

    # --- retention ------------------------------------------------------------------------
    def prune(self, keep: float, max_step: float | None) -> tuple[int, int] | str:
        """Store.prune's work: the clock checked (a reason why not, as a string, with only
        the clock's record written), else the horizon moved and the deletes made."""
        now, mono, boot = self.now, time.monotonic(), _boot_id()
        older_than = now - keep
        conn = self._conn
        horizon = float(conn.execute("SELECT horizon FROM retention WHERE id=1").fetchone()[0])
        row = conn.execute("SELECT value FROM meta WHERE key='retention_clock'").fetchone()
        previous = json.loads(row[0]) if row else None
        # the clock is recorded even when it is refused: a clock that was stepped and stays
        # stepped is consistent with itself at the next pass
        conn.execute("INSERT INTO meta (key, value) VALUES ('retention_clock', ?)"
                     " ON CONFLICT (key) DO UPDATE SET value=excluded.value",
                     (json.dumps({"wall": now, "mono": mono, "boot": boot}),))
        newest = max((r[0] for r in (
            conn.execute("SELECT max(at) FROM audit").fetchone(),
            conn.execute("SELECT max(at) FROM grants").fetchone()) if r[0] is not None),
            default=None)
        problem = check_prune_clock(now, mono, boot, previous, newest)
        if problem:
            return problem
        if max_step is not None and horizon > 0:
            older_than = min(older_than, horizon + max_step)
        terminal = terminal_list(TERMINAL_STATES)
        conn.execute(f"UPDATE retention SET horizon={self._greatest}(horizon, ?) WHERE id=1",  # noqa: S608
                     (older_than,))
        intents = conn.execute(
            f"DELETE FROM intents AS i WHERE i.state IN ({terminal}) AND i.updated_at < ?"  # noqa: S608
            " AND (i.phase = 'resolve' OR EXISTS (SELECT 1 FROM intents r"
            "      WHERE r.fingerprint = i.fingerprint AND r.starts_at = i.starts_at"
            "      AND r.phase = 'resolve'))", (older_than,)).rowcount
        audit = conn.execute(
            f"DELETE FROM audit WHERE at < ? AND (intent_id IS NULL OR intent_id NOT IN"  # noqa: S608
            f" (SELECT id FROM intents WHERE state NOT IN ({terminal})))",
            (older_than,)).rowcount
        conn.execute("DELETE FROM grants WHERE at < ?", (older_than,))
        return intents, audit


class Store:
    """Thread-safe access: one connection per thread, explicit transactions. What runs outside
    a transaction (claims, lease renewals, retention, the reads of the API and /metrics) is a
    method here; everything inside one is a method of the Transaction that transaction()
    yields, so callers never hold a connection."""

    GREATEST = "max"  # the scalar max() of two values in this dialect
    _file: tuple[int, int] | None = None  # see check_file(); PostgreSQL has no file

    def __init__(self, path: Path, *, max_bytes: int | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        """`max_bytes` caps the file (SQLite max_page_count): past it every write fails as on
        a full disk, so the store cannot fill the disk it shares with checkpoints. `clock` is
        the host's wall clock (time.time; tests inject a wrong one)."""
        self.path = path
        self.max_bytes = max_bytes
        self.clock = StoreClock(clock)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._leases = LeaseWatch()
        # (device, inode) of the file opened, once it exists; None only while __init__ runs
        # (the one connection allowed to create the file)
        self._file: tuple[int, int] | None = None
        conn = self._conn()
        self._file = _identity(path)
        _migrate(conn)
        conn.executescript(f"BEGIN IMMEDIATE;{SCHEMA}{SEED}COMMIT;")
        self.check_file()  # nobody swapped the file while the schema was written
        for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            with contextlib.suppress(OSError):  # audit details may hold host names, stack dumps
                name.chmod(0o600)

    def check_file(self) -> None:
        """Raise StoreFileGone unless the file at the path is still the one this store opened
        (same device and inode). SQLite keeps writing to an open file that was unlinked or
        renamed away, and answers every commit as if it were durable: without this check a
        deleted store swallows every alert after it (answered 2xx, then lost)."""
        if self._file is not None:
            found = _identity(self.path)
            if found != self._file:
                raise StoreFileGone(
                    f"store file {self.path} was replaced while the service ran (device/inode "
                    f"{self._file[0]}/{self._file[1]} opened, {found[0]}/{found[1]} there now); "
                    "nothing is recorded until the service is restarted")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        self.check_file()  # a read of an unlinked file would show a store that is gone
        if conn is None:
            # mode=rw after the first open: a thread's new connection must never create an
            # empty store where the real one was deleted
            mode = "rwc" if self._file is None else "rw"
            uri = f"file:{quote(str(self.path.absolute()))}?mode={mode}"
            conn = sqlite3.connect(uri, uri=True, timeout=30.0, isolation_level=None,
                                   check_same_thread=True)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            sync = "NORMAL" if getattr(self._local, "worker", False) else "FULL"
            conn.execute(f"PRAGMA synchronous={sync}")
            conn.execute("PRAGMA busy_timeout=30000")
            if self.max_bytes:
                page = conn.execute("PRAGMA page_size").fetchone()[0]
                conn.execute(f"PRAGMA max_page_count={max(self.max_bytes // page, 2)}")
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
    def transaction(self) -> Iterator[Transaction]:
        """BEGIN IMMEDIATE: take the write lock up front so check-then-act is atomic across
        processes (cooldown, rate limit, breaker and claims cannot race)."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            now = self.clock.host_time()
            yield Transaction(conn, self.GREATEST, now)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        # the file may have gone between the check in _conn() and the commit: then the commit
        # went to an unlinked file, and the caller must not report it as recorded
        self.check_file()

    def ping(self) -> bool:
        return self._conn().execute("SELECT 1").fetchone()[0] == 1

    def probe_commit(self) -> None:
        """Commit one small write with intake's durability; raises what intake would meet
        (read-only or full disk, a store over max_bytes, a lock held too long)."""
        with self.transaction() as tx:
            tx.execute("INSERT INTO readiness (id, at) VALUES (1, ?)"
                         " ON CONFLICT (id) DO UPDATE SET at=excluded.at", (tx.now,))

    def checkpoint(self) -> None:
        """Fold the WAL into the main file, so the file a marker names is never empty."""
        self._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")

    @staticmethod
    def is_storage_failure(exc: BaseException) -> bool:
        """A full or damaged store, a lock timeout, a lost connection: not the alert's fault
        (the whole delivery fails with 5xx and Alertmanager retries it)."""
        return isinstance(exc, sqlite3.OperationalError) or type(exc) is sqlite3.DatabaseError

    def quick_check(self) -> str:
        """'ok', or SQLite's first complaint about a damaged page or index."""
        row = self._conn().execute("PRAGMA quick_check(1)").fetchone()
        return str(row[0])

    def store_id(self) -> str:
        return str(self._conn().execute(
            "SELECT value FROM meta WHERE key='store_id'").fetchone()[0])

    def prune(self, keep: float, *, max_step: float | None = None) -> tuple[int, int]:
        """Retention: delete finished history last touched more than `keep` seconds before the
        store's time (the database's clock on PostgreSQL, so one replica's wrong clock cannot
        move the horizon past the others' rows).
        Intents go only once finished and resolved (their idempotency key is no longer needed:
        Alertmanager stops resending a resolved alert), so an alert that still fires is never
        acted on twice; audit rows go only when their intent is finished or gone. Returns
        (intents, audit rows) deleted.

        The horizon comes from the wall clock, which can jump: a clock 100 days ahead for a
        few seconds would delete every finished intent's audit rows and every grant (the
        cooldowns). So the clock is checked first (check_prune_clock: against the newest
        recorded time and the previous prune), ClockSuspect is raised and nothing is deleted
        when it moved backwards or leapt ahead; and with `max_step` the horizon moves at most
        that far past the previous prune's, so a jump the checks cannot see (the first prune
        on another host) moves it one step only, and retention after a long stop catches up
        over several passes."""
        with self.transaction() as tx:
            done = tx.prune(keep, max_step)
        if isinstance(done, str):  # committed: the clock record; nothing deleted
            raise ClockSuspect(f"retention refused: {done}; nothing was deleted")
        return done

    # --- the worker's claims and leases -------------------------------------------------
    def claim(self, owner: str, lease_seconds: float) -> Intent | None:
        """Atomically take one runnable intent: pending and due, or running with a lease that
        this store's LeaseWatch has seen unrenewed for its lease_seconds (its holder died or
        hung). Exactly one claimant wins, whatever the process; the claim bumps the intent's
        lease generation, so a former holder can no longer write (owns())."""
        with self.transaction() as conn:
            now = conn.now  # not_before (retry backoff) and updated_at: the store's time
            running = conn.execute("SELECT id, lease_gen, lease_beat, lease_until, lease_seconds"
                                   " FROM intents WHERE state='running'").fetchall()
            expired = self._leases.expired(running, lease_seconds)
            row = conn.execute(
                "UPDATE intents SET state='running', lease_owner=?, lease_gen=lease_gen+1,"
                " lease_beat=0, lease_seconds=?, lease_until=NULL, updated_at=?"
                " WHERE id = (SELECT id FROM intents WHERE (state='pending' AND not_before<=?)"
                " OR (state='running' AND id=?) ORDER BY id LIMIT 1)"
                " RETURNING *",
                (owner, lease_seconds, now, now, min(expired, default=-1))).fetchone()
        return Intent.from_row(row) if row else None

    def renew_leases(self, owner: str, lease_seconds: float) -> None:
        """The heartbeat: every lease `owner` holds gets a new beat (observers restart their
        count) and may again go `lease_seconds` unrenewed."""
        with self.transaction() as conn:
            conn.execute("UPDATE intents SET lease_beat=lease_beat+1, lease_seconds=?"
                         " WHERE state='running' AND lease_owner=?", (lease_seconds, owner))

    # --- reads outside a transaction ------------------------------------------------------
    def grant_history(self, playbook: str, since: float) -> list[GrantRow]:
        """Transaction.grant_history, read outside a transaction (/metrics)."""
        # a read: the transaction's `now` (the store clock's, which may refuse a skewed
        # clock) is never consulted here, and /metrics must answer even then
        return Transaction(self._conn(), self.GREATEST, time.time()).grant_history(
            playbook, since)

    def grants_by_priority(self, since: float) -> dict[int, int]:
        """Grants since `since` by priority (the breakers' gauges: /metrics)."""
        rows = self._conn().execute(
            "SELECT priority, count(*) FROM grants WHERE at>=? GROUP BY priority", (since,))
        return {int(r[0]): int(r[1]) for r in rows}

    def get_intent(self, intent_id: int) -> Intent | None:
        row = self._conn().execute("SELECT * FROM intents WHERE id=?", (intent_id,)).fetchone()
        return Intent.from_row(row) if row else None

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
        """Running totals (kept by the audit_counts trigger; they survive retention)."""
        rows = self._conn().execute("SELECT key, value FROM counters WHERE kind='decision'")
        return {r[0]: int(r[1]) for r in rows}

    def action_counts(self) -> list[tuple[str, str, str, int]]:
        rows = self._conn().execute("SELECT key, value FROM counters WHERE kind='action'")
        out = []
        for key, value in rows:
            playbook, action, decision = json.loads(key)
            out.append((playbook, action, decision, int(value)))
        return out

    def state_counts(self) -> dict[str, int]:
        rows = self._conn().execute("SELECT state, count(*) FROM intents GROUP BY state")
        return {r[0]: int(r[1]) for r in rows}

    def oldest_pending_age(self) -> float:
        row = self._conn().execute(
            "SELECT min(created_at) FROM intents WHERE state IN ('pending','running')").fetchone()
        return time.time() - row[0] if row and row[0] else 0.0
