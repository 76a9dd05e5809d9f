"""A job's second stall within the stall playbooks' cooldown is acted on; the same stall is
acted on once (docs/performance.md, Chaos soak, bug 3: after one hang was healed, the next hang
of the job's next incarnation 176 s later was refused by stalled_job_quarantine's 10-minute
cooldown on the job, and nobody healed it).

The shipped stalled_job_diagnostics and stalled_job_quarantine playbooks' matching, target,
cooldown and limits (`cooldown_ends_on: job_progress`), with their steps replaced by an http
step to a loopback stand-in (the quarantine needs a scheduler: tests/slurm/test_heal_hang.py
runs the real thing); the in-process service with its real worker and SQLite store, and a
loopback Prometheus stand-in answering when the job last stepped."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from tests.remediation.helpers import REPO, alert, auth, payload, serving, stub_server
from trainwatch.remediation.playbooks import (
    COOLDOWN_ENDS_ON_PROGRESS,
    PlaybookError,
    parse_playbook,
)

BOOKS = ("stalled_job_diagnostics", "stalled_job_quarantine")
JOB = "llm-7"
# what the shipped playbooks decide with: everything but their steps
KEPT = ("name", "match", "target", "cooldown", "cooldown_ends_on", "rate_limit", "priority")


class Prometheus:
    """Answers the instant query for the job's newest step with `last_step` (None: no
    series), and records the queries."""

    def __init__(self) -> None:
        self.last_step: float | None = None
        self.queries: list[str] = []
        self.lock = threading.Lock()


@contextmanager
def prometheus() -> Iterator[tuple[str, Prometheus]]:
    state = Prometheus()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query).get("query", [""])[0]
            with state.lock:
                state.queries.append(query)
                value = state.last_step
            result = ([] if value is None or f'training_job="{JOB}"' not in query
                      else [{"metric": {}, "value": [value, repr(value)]}])
            body = json.dumps({"status": "success",
                               "data": {"resultType": "vector", "result": result}}).encode()
            self.send_response(200 if url.path == "/api/v1/query" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serving(Handler) as address:
        yield f"http://{address}", state


def shipped_with_http_steps(hostport: str) -> list[dict[str, Any]]:
    docs = []
    for name in BOOKS:
        doc = yaml.safe_load((REPO / "remediation" / "playbooks" / f"{name}.yaml").read_text())
        kept = {key: doc[key] for key in KEPT if key in doc}
        kept["steps"] = [{"action": "http", "url": f"http://{hostport}/{name}/"
                          "${labels.training_job}", "json": {"rank": "${labels.rank}"}}]
        docs.append(kept)
    return docs


def rfc3339(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat().replace("+00:00", "Z")


def stalled(rank: str, node: str, began: float, fingerprint: str) -> dict[str, Any]:
    return alert("TrainingStalled", {"training_job": JOB, "rank": rank, "node": node,
                                     "instance": f"{node}:9446", "severity": "critical",
                                     "component": "training"},
                 fingerprint=fingerprint, starts_at=rfc3339(began))


def test_the_next_stall_within_the_cooldown_is_acted_on_and_the_same_stall_once(
        service_factory) -> None:
    with stub_server() as (hostport, actions), prometheus() as (prom, metrics):
        books = shipped_with_http_steps(hostport)
        for book in books:  # what the fix rests on: the shipped cooldown ends on progress
            assert book["cooldown_ends_on"] == COOLDOWN_ENDS_ON_PROGRESS
        with service_factory(books, prometheus_url=prom) as svc:
            def send(*alerts: dict[str, Any]) -> None:
                resp = svc.client.post("/v1/alerts", json=payload(*alerts), headers=auth())
                assert resp.status_code == 200, resp.data
                svc.wait_idle()

            def acted() -> list[str]:
                return sorted(r.path for r in actions.posts())

            def last_action() -> float:
                """The newest grant of either playbook (their decisions for one alert may
                be milliseconds apart on a loaded machine)."""
                with svc.store.transaction() as tx:
                    rows = [row for name in BOOKS
                            for row in tx.grant_history(name, 0.0, f"training_job={JOB}")]
                return max(row.at for row in rows)

            # the first stall: rank 1 on tw-gpu-03 stopped; the job last stepped 40 s ago
            with svc.store.transaction() as tx:
                now = tx.now
            metrics.last_step = now - 40
            first = stalled("1", "tw-gpu-03", now - 20, "a1")
            send(first)
            assert acted() == [f"/{name}/{JOB}" for name in BOOKS]
            healed_at = last_action()
            # Alertmanager delivers the same alert again (repeat, a retry): recorded once
            send(first)
            # another suspect rank's alert of the same stall, begun before the action
            send(stalled("0", "tw-gpu-01", now - 19, "a2"))
            # the requeued job restarting shows the stall again (the alerts' condition holds
            # until it steps): an alert begun after the action, the job not stepped since
            # (the times below are the store's, after the first action and before any later
            # decision: each send waits for its decision, which takes milliseconds at least)
            send(stalled("1", "tw-gpu-02", healed_at + 0.001, "a3"))
            assert len(acted()) == 2, "the same stall is acted on once"
            cooled = svc.audit("cooled_down")
            assert len(cooled) == 4 and {a["playbook"] for a in cooled} == set(BOOKS)
            assert any("not stepped since" in a["reason"] for a in cooled)
            assert any("began before that action" in a["reason"] for a in cooled)
            # the job's next incarnation steps, then stalls (rank 1 on tw-gpu-02), within the
            # 10-minute cooldown of the first heal: a new stall, acted on
            metrics.last_step = healed_at + 0.002
            second = stalled("1", "tw-gpu-02", healed_at + 0.003, "b1")
            send(second)
            assert acted() == sorted([f"/{name}/{JOB}" for name in BOOKS] * 2)
            # ... and its own redelivery and a second rank's alert of it are not acted on twice
            send(second, stalled("0", "tw-gpu-01", healed_at + 0.003, "b2"))
            assert len(acted()) == 4
            assert len(svc.audit("acted")) == 4
            assert any(f'training_job="{JOB}"' in q for q in metrics.queries)


def test_a_cooldown_ending_on_progress_needs_the_job_in_the_target(tmp_path: Path) -> None:
    doc = {"name": "by_node", "match": {"alertname": ["TrainingStalled"]}, "target": ["node"],
           "cooldown": "10m", "cooldown_ends_on": COOLDOWN_ENDS_ON_PROGRESS,
           "steps": [{"action": "http", "url": "http://127.0.0.1:9/x", "json": {}}]}
    with pytest.raises(PlaybookError, match="the target must name training_job"):
        parse_playbook(doc, tmp_path / "by_node.yaml")
    book = parse_playbook({**doc, "target": ["training_job"]}, tmp_path / "by_job.yaml")
    assert book.cooldown_ends_on == COOLDOWN_ENDS_ON_PROGRESS
