"""Flask application factory: webhook intake, audit/approval API, health and metrics.

The webhook answers 200 only after the intents are committed to SQLite
(trainwatch.remediation.committer
batches concurrent deliveries into one fsync), and 200 even if the
actions later fail: Alertmanager retries 5xx (re-running the action is exactly what must not
happen), while a 4xx is not retried, which is what garbage deserves. Order of checks:
401 (token, constant time) -> 413 (size) -> 400 (not JSON, or not a v4 envelope) -> each
alert on its own, validated by the request thread before the store is touched (an invalid one
is recorded with its reason; 200 when every alert was recorded) -> 503 only for a delivery
that was not recorded (the store failed or stayed busy past the deadline; a large one
recorded in part says how much), which is when a retry helps (trainwatch.remediation.committer).

Credentials: the webhook token posts alerts and reads the audit; approving or rejecting needs
an approver token (trainwatch.remediation.approvers), and the audit records the approver's name
bound to
that token. The webhook token is refused there (403).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from trainwatch.exporters.contract.tokens import bearer, token_matches
from trainwatch.remediation import lifecycle
from trainwatch.remediation.approvers import ApproverFile
from trainwatch.remediation.committer import CommitFailed, GroupCommitter
from trainwatch.remediation.config import Config
from trainwatch.remediation.ingest import printable
from trainwatch.remediation.metrics import StoreCollector, WebhookMetrics
from trainwatch.remediation.playbooks import Playbook, load_playbooks
from trainwatch.remediation.schemas import first_error
from trainwatch.remediation.store import Store
from trainwatch.remediation.stores import open_store

log = logging.getLogger(__name__)
bp = Blueprint("remediation", __name__)
# SQLite INTEGER is 64-bit: a larger id must be a 4xx, not an OverflowError (500).
MAX_INTENT_ID = 2**63 - 1
QUICK_CHECK_EVERY = 60.0  # seconds between integrity checks of the store (they read it all)
PROBE_EVERY = 1.0  # seconds between readiness probe commits


class Readiness:
    """What /readyz checks: a commit with intake's durability goes through, intake's own last
    commit did not fail, and the store's pages and indexes are intact. The probe commit (an
    fsync) runs at most once a second and the integrity check (it reads the whole file) once a
    minute, so frequent probes cannot compete with intake for the write lock."""

    def __init__(self, store: Store, committer: GroupCommitter) -> None:
        self.store = store
        self.committer = committer
        self._lock = threading.Lock()
        self._probed_at = float("-inf")
        self._probe_problem: str | None = None
        self._checked_at = float("-inf")
        self._integrity = "ok"

    def problems(self) -> list[str]:
        with self._lock:
            now = time.monotonic()
            if now - self._probed_at >= PROBE_EVERY:
                try:
                    self.store.probe_commit()
                    self._probe_problem = None
                except Exception as exc:
                    self._probe_problem = (f"store cannot commit: {type(exc).__name__}: "
                                           f"{printable(exc, 200)}")
                self._probed_at = time.monotonic()
            if now - self._checked_at >= QUICK_CHECK_EVERY:
                try:
                    self._integrity = self.store.quick_check()
                except Exception as exc:
                    self._integrity = f"{type(exc).__name__}: {exc}"
                self._checked_at = time.monotonic()
            problems = [self._probe_problem] if self._probe_problem else []
            if self._integrity != "ok":
                problems.append(f"store is damaged: {printable(self._integrity, 200)}")
        failing = self.committer.failing()
        if failing:
            problems.append(f"intake commits are failing: {printable(failing, 200)}")
        return problems


class Services:
    """What request handlers need; one per app."""

    def __init__(self, config: Config, store: Store, books: Mapping[str, Playbook],
                 worker: Any = None) -> None:
        self.config = config
        self.store = store
        self.books = books
        self.worker = worker
        # re-read when it changes: an approver revoked on disk is refused at the next request
        self.approvers = (ApproverFile(config.approvers_file, config.approvers,
                                       webhook_token=config.webhook_token)
                          if config.approvers_file else None)
        self.registry = CollectorRegistry()
        self.registry.register(StoreCollector(store, config))
        self.metrics = WebhookMetrics(self.registry)
        self.committer = GroupCommitter(store, books, escalate=bool(config.pager_url))
        self.readiness = Readiness(store, self.committer)


def services() -> Services:
    return current_app.extensions["trainwatch_remediation"]


def _bearer() -> str | None:
    return bearer(request.headers.get("Authorization"))


def _is_webhook_token(token: str | None) -> bool:
    return token_matches(token, services().config.webhook_token)


def _authorized() -> bool:
    """The webhook token (Alertmanager): may post alerts and read the audit."""
    return _is_webhook_token(_bearer())


def _approver() -> str | None:
    """The approver's name bound to the presented token (never a header), or None."""
    token = _bearer()
    if token is None or _is_webhook_token(token):
        return None
    svc = services()
    current = svc.approvers.current() if svc.approvers else svc.config.approvers
    return current.identify(token)


def _error(status: int, message: str) -> Response:
    resp = jsonify({"error": message})
    resp.status_code = status
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="trainwatch-remediation"'
    return resp


@bp.post("/v1/alerts")
def receive_alerts() -> Response:
    svc = services()
    started = time.perf_counter()
    resp = _receive(svc)
    svc.metrics.requests.labels(str(resp.status_code)).inc()
    svc.metrics.latency.observe(time.perf_counter() - started)
    return resp


def _receive(svc: Services) -> Response:
    if not _authorized():
        return _error(401, "missing or invalid bearer token")
    length = request.content_length
    if length is not None and length > svc.config.max_body_bytes:
        return _error(413, f"body larger than {svc.config.max_body_bytes} bytes")
    body = request.stream.read(svc.config.max_body_bytes + 1)
    if len(body) > svc.config.max_body_bytes:
        return _error(413, f"body larger than {svc.config.max_body_bytes} bytes")
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return _error(400, "body is not JSON")
    try:
        problem = first_error("webhook", payload)
    except RecursionError:
        problem = "payload nested too deeply"
    if problem:
        return _error(400, f"not an Alertmanager v4 webhook payload: {problem}")
    try:
        result = svc.committer.submit(payload)
    except CommitFailed as exc:  # not recorded: 5xx, so Alertmanager retries
        return _error(503, f"not recorded, retry: {exc}")
    for outcome in ("accepted", "deduplicated", "refused", "resolved", "unmatched", "invalid"):
        count = getattr(result, outcome)
        if count:
            svc.metrics.alerts.labels(outcome).inc(count)
    if svc.worker is not None:
        svc.worker.wake()
    return jsonify({"accepted": result.accepted, "deduplicated": result.deduplicated,
                    "refused": result.refused, "resolved": result.resolved,
                    "unmatched": result.unmatched, "invalid": result.invalid,
                    "intents": result.intents})


@bp.get("/v1/actions")
def list_actions() -> Response:
    if not _authorized() and _approver() is None:
        return _error(401, "missing or invalid bearer token")
    try:
        limit = min(max(int(request.args.get("limit", "100")), 1), 10000)
        intent_id = request.args.get("intent")
        intent = int(intent_id) if intent_id is not None else None
        if intent is not None and not 0 < intent <= MAX_INTENT_ID:
            raise ValueError(intent_id)
    except ValueError:
        return _error(400, "limit and intent must be integers (intent an id >= 1)")
    store = services().store
    state = request.args.get("state")
    decision = request.args.get("decision")
    return jsonify({
        "actions": [] if intent is not None else store.list_intents(limit, state),
        "audit": store.list_audit(limit, intent, decision),
    })


def _set_approval(intent_id: int, approve: bool) -> Response:
    svc = services()
    if _is_webhook_token(_bearer()):
        return _error(403, "the webhook token cannot approve or reject; use an approver token "
                           "(approvers_file)")
    who = _approver()
    if who is None:
        return _error(401, "missing or invalid approver token"
                      + ("" if svc.config.approvers_file else
                         " (no approvers configured: set approvers_file)"))
    with svc.store.transaction() as tx:
        answer = lifecycle.approve(tx, intent_id, who, approved=approve)
    outcome, state = answer.outcome, answer.state
    if outcome == "missing":
        return _error(404, f"no intent {intent_id}")
    if outcome == "not_awaiting":
        return _error(409, f"intent {intent_id} is {state}, not awaiting_approval")
    if outcome == "cancelled":
        return _error(409, f"intent {intent_id}: the alert has resolved; cancelled")
    if approve and svc.worker is not None:
        svc.worker.wake()
    return jsonify({"id": intent_id, "state": "pending" if approve else "rejected",
                    "by": who, "overrides": list(answer.overrides)})


@bp.post(f"/v1/actions/<int(max={MAX_INTENT_ID}):intent_id>/approve")
def approve(intent_id: int) -> Response:
    return _set_approval(intent_id, True)


@bp.post(f"/v1/actions/<int(max={MAX_INTENT_ID}):intent_id>/reject")
def reject(intent_id: int) -> Response:
    return _set_approval(intent_id, False)


@bp.get("/healthz")
def healthz() -> Response:
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    svc = services()
    problems = svc.readiness.problems()
    if svc.worker is not None and not svc.worker.alive():
        problems.append("worker threads not running")
    if svc.worker is not None and (stuck := svc.worker.stuck()):
        problems.append(f"{stuck} worker thread(s) stuck in a step past its timeout")
    if problems:
        resp = jsonify({"status": "not ready", "problems": problems})
        resp.status_code = 503
        return resp
    return jsonify({"status": "ready", "playbooks": sorted(svc.books)})


@bp.get("/metrics")
def metrics() -> Response:
    return Response(generate_latest(services().registry), mimetype=CONTENT_TYPE_LATEST)


def create_app(config: Config, *, worker: Any = None, store: Store | None = None,
               books: Mapping[str, Playbook] | None = None) -> Flask:
    """Build the app. Tests pass no worker (intake only) or their own; the server passes one."""
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = None  # enforced in the handler, after authentication
    app.json.sort_keys = False  # type: ignore[attr-defined]
    store = store or open_store(config)
    books = books if books is not None else load_playbooks(config.playbooks_dir)
    app.extensions["trainwatch_remediation"] = Services(config, store, books, worker)
    app.register_blueprint(bp)
    return app
