"""The store owns its SQL (issue 27): no statement outside the store modules, and the walk of a
webhook payload and of Engine.process reach the store through few statements.

Why a test: SQL written beside the lifecycle (ingest, the engine, the approval API, the group
committer, an action) is how one transition came to be spelled in three places, each with
its own round trips; a reader of the store could not see what the service asks of it."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from tests.remediation.conftest import make_service
from tests.remediation.helpers import REPO, alert, payload, stub_server
from trainwatch.remediation.engine import Engine
from trainwatch.remediation.ingest import ingest
from trainwatch.remediation.playbooks import load_playbooks

# Where SQL may be written: the remediation store (SQLite, PostgreSQL, the tables of both),
# and the two other stores the project keeps, each one class owning its own SQLite file (the
# node exporter's command log, the goodput ledger's file).
STORE_MODULES = frozenset({
    "remediation/store.py", "remediation/pgstore.py", "remediation/schema.py",
    "exporters/node/training/command_log.py", "exporters/node/training/ledger.py"})
SKIPPED_DIRS = frozenset({"tests", "node_modules", "build", "dist", "__pycache__"})
# A statement, or a fragment of one (a WHERE clause concatenated onto another string).
# Upper case only, as the project writes SQL: English prose in messages does not match.
SQL = re.compile(r"""
    \bSELECT\b[\s\S]*\bFROM\b | ^\s*SELECT\s
  | \bINSERT\s+(?:OR\s+\w+\s+)?INTO\b | \bUPDATE\s+\w+\s+SET\b | \bDELETE\s+FROM\b
  | \b(?:CREATE|DROP|ALTER)\s+(?:TABLE|INDEX|TRIGGER|UNIQUE\s+INDEX|VIEW|FUNCTION|DATABASE)\b
  | ^\s*(?:SAVEPOINT|RELEASE|ROLLBACK|BEGIN|COMMIT|PRAGMA|VACUUM)\b
  | \bWHERE\s+[\w.]+\s*(?:=|<|>|\bIN\b|\bIS\b) | \bON\s+CONFLICT\b | \bRETURNING\b
""", re.VERBOSE | re.MULTILINE)
EXECUTE = frozenset({"execute", "executemany", "executescript"})


def python_files() -> list[Path]:
    out = []
    for path in sorted(REPO.rglob("*.py")):
        parts = path.relative_to(REPO).parts
        if any(p.startswith(".") or p in SKIPPED_DIRS for p in parts[:-1]):
            continue
        out.append(path)
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    """id() of every docstring node (prose, which may name a statement it explains)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def sql_in(source: str) -> list[str]:
    """'line: what' for every SQL string literal and every execute() call in `source`."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    inside_fstring: set[int] = set()
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.JoinedStr):
            inside_fstring.update(id(v) for v in node.values)
            text = "".join(v.value if isinstance(v, ast.Constant) else "?" for v in node.values
                           if isinstance(v, ast.Constant | ast.FormattedValue))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docs and id(node) not in inside_fstring):
            text = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in EXECUTE):
            found.append(f"{node.lineno}: .{node.func.attr}() call")
        if text is not None and SQL.search(text):
            found.append(f"{node.lineno}: {text.strip()[:60]!r}")
    return found


def test_no_sql_outside_the_store_modules() -> None:
    """Every Python file of the project outside tests/ and the store modules: no SQL string
    and no execute() call. (Failed before issue 27 on ingest.py, engine.py, app.py,
    committer.py, stores.py and actions/quarantine.py.)"""
    files = python_files()
    assert len(files) > 100  # the walk found the project
    offenders = {}
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        if rel in STORE_MODULES:
            continue
        found = sql_in(path.read_text(encoding="utf-8"))
        if found:
            offenders[rel] = found
    assert not offenders, f"SQL outside the store modules {sorted(STORE_MODULES)}: {offenders}"


def test_the_detector_sees_what_it_must() -> None:
    """The check above is only as good as what it recognises: each shape SQL took before."""
    caught = [
        'conn.execute("SELECT id FROM intents WHERE fingerprint=?", (fp,))',
        'x = ("INSERT INTO grants (at, playbook) VALUES (?,?)")',
        'q = f"UPDATE intents SET {cols} WHERE id=?"',
        'q = " WHERE state=?"',
        'conn.execute(f"SAVEPOINT {name}")',
        'run(sql)\nconn.executescript(script)',
        'S = """\nCREATE TABLE IF NOT EXISTS t (a TEXT);\n"""',
    ]
    for source in caught:
        assert sql_in(source), source
    ignored = [
        '"""The claim is an atomic\nUPDATE with a lease."""',
        'ROLLBACK = "rollback"',
        'msg = "select the playbook from the list"',
        'log.info("Rollback is decided once and applied by all ranks")',
    ]
    for source in ignored:
        assert not sql_in(source), source


class Counting:
    """A store connection that notes every statement handed to it: one round trip each."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements: list[str] = []

    def execute(self, sql: str, *args: Any) -> Any:
        self.statements.append(sql)
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def test_intake_and_engine_reach_the_store_in_few_statements(
        tmp_path: Path, store_section: dict[str, Any]) -> None:
    """Statements (SQLite round trips, BEGIN and COMMIT included) for: a notification of ten
    new firing alerts, its redelivery (ten duplicates), Engine.process of one intent through
    its decision (cooldown, rate limit, breaker, grant) and two steps, and the resolve of all
    ten (nine firing intents still pending: each cancelled). Before issue 27, on SQLite: 14,
    34, 19 and 52 (a duplicate looked its intent up before auditing it; the engine read the
    lease, the resolve and `acted` in three statements, and each cooldown, rate limit and
    breaker in its own); the budgets are what the store's calls take now. PostgreSQL runs the
    same statements plus its write lock in each transaction (one per walk here, three in
    Engine.process: the decision, one step's progress, the completion)."""
    with stub_server() as (hostport, state):
        book = {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
                "target": ["training_job"], "cooldown": "1h",
                "rate_limit": {"count": 5, "window": "1h"},
                "steps": [{"action": "http", "url": f"http://{hostport}/a"},
                          {"action": "http", "url": f"http://{hostport}/b"}],
                "on_resolve": [{"action": "http", "url": f"http://{hostport}/undo"}]}
        with make_service(tmp_path, [book], start_worker=False, **store_section) as svc:
            books = load_playbooks(svc.config.playbooks_dir)
            firing = [alert("TrainingLossSpike", {"training_job": f"j{i}"},
                            fingerprint=f"{i:016x}") for i in range(10)]
            counting = Counting(svc.store._conn())
            svc.store._local.conn = counting  # this thread's connection, as the store keeps it
            seen = counting.statements
            counts = {}
            result = ingest(svc.store, books, payload(*firing), escalate=False)
            assert result.accepted == 10
            counts["notification"] = len(seen)
            seen.clear()
            assert ingest(svc.store, books, payload(*firing), escalate=False).deduplicated == 10
            counts["redelivery"] = len(seen)
            intent = svc.store.claim("owner", 60.0)
            assert intent is not None
            seen.clear()
            Engine(svc.config, svc.store, books, "owner").process(intent)
            counts["process"] = len(seen)
            assert [r.path for r in state.posts()] == ["/a", "/b"]
            resolved = [{**a, "status": "resolved"} for a in firing]
            seen.clear()
            assert ingest(svc.store, books, payload(*resolved), escalate=False).resolved == 10
            counts["resolve"] = len(seen)
            svc.store._local.conn = counting.conn
            assert len(svc.audit("acted")) == 1 and len(svc.audit("cancelled")) == 9
    locks = {"notification": 1, "redelivery": 1, "process": 3, "resolve": 1}
    budget = {"notification": 14, "redelivery": 24, "process": 13, "resolve": 52}
    if store_section:  # PostgreSQL
        budget = {walk: n + locks[walk] for walk, n in budget.items()}
    assert counts == budget, counts
