"""Decisions and execution with real worker threads, real SQLite and a real loopback HTTP
target: cooldown, rate limit, circuit breaker, dry-run, approval (API and CLI), on_resolve,
retries ending in `failed`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.remediation.helpers import APPROVERS, TOKEN, alert, auth, payload, stub_server
from tests.support.net import wait_until


def http_book(hostport: str, **extra: Any) -> dict[str, Any]:
    return {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
            "target": ["training_job"],
            "steps": [{"action": "http", "url": f"http://{hostport}/hook/${{labels.training_job}}",
                       "json": {"job": "${labels.training_job}"}}], **extra}


def send(svc, *alerts: dict[str, Any]) -> dict[str, Any]:
    resp = svc.client.post("/v1/alerts", json=payload(*alerts), headers=auth())
    assert resp.status_code == 200, resp.data
    return resp.json


def test_cooldown_then_rate_limit_per_target(service_factory) -> None:
    with stub_server() as (hostport, state):
        book = http_book(hostport, cooldown="1h", rate_limit={"count": 5, "window": "1h"})
        with service_factory([book]) as svc:
            send(svc, alert("TrainingLossSpike", {"training_job": "a"}))
            svc.wait_idle()
            send(svc, alert("TrainingLossSpike", {"training_job": "a"}),
                 alert("TrainingLossSpike", {"training_job": "b"}))
            svc.wait_idle()
            assert sorted(r.path for r in state.posts()) == ["/hook/a", "/hook/b"]
            (cooled,) = svc.audit("cooled_down")
            assert cooled["target_key"] == "training_job=a"
            assert len(svc.audit("acted")) == 2


def test_rate_limit_counts_per_window(service_factory) -> None:
    with stub_server() as (hostport, state):
        book = http_book(hostport, rate_limit={"count": 2, "window": "1h"})
        with service_factory([book]) as svc:
            for _ in range(4):
                send(svc, alert("TrainingLossSpike", {"training_job": "a"}))
                svc.wait_idle()
            assert len(state.posts()) == 2
            limited = svc.audit("rate_limited")
            assert len(limited) == 2 and "limit 2" in limited[0]["reason"]


def test_circuit_breaker_opens_and_is_exported(service_factory) -> None:
    with stub_server() as (hostport, state), service_factory([http_book(hostport)],
                         circuit_breaker={"max_actions": 3, "window": "1h"}) as svc:
        send(svc, *[alert("TrainingLossSpike", {"training_job": f"j{i}"}) for i in range(6)])
        svc.wait_idle()
        assert len(state.posts()) == 3
        refused = svc.audit("refused")
        assert len(refused) == 3
        assert all("circuit breaker open" in r["reason"] for r in refused)
        text = svc.client.get("/metrics").data.decode()
        assert "trainwatch_remediation_circuit_breaker_open 1.0" in text


def test_dry_run_plans_without_acting(service_factory) -> None:
    with stub_server() as (hostport, state), \
            service_factory([http_book(hostport, dry_run=True)]) as svc:
        send(svc, alert("TrainingLossSpike", {"training_job": "a"}))
        svc.wait_idle()
        assert state.posts() == []
        (rec,) = svc.audit("dry_run")
        assert rec["detail"]["steps"][0]["action"] == "http"


def test_approval_gate_with_api_and_reject(service_factory) -> None:
    with stub_server() as (hostport, state), \
            service_factory([http_book(hostport, requires_approval=True)]) as svc:
        first = send(svc, alert("TrainingLossSpike", {"training_job": "a"}))["intents"][0]
        second = send(svc, alert("TrainingLossSpike", {"training_job": "b"}))["intents"][0]
        svc.wait_idle()
        assert state.posts() == []
        assert len(svc.audit("awaiting_approval")) == 2
        assert svc.client.post(f"/v1/actions/{first}/approve").status_code == 401
        huge = 10**20  # beyond SQLite's 64-bit INTEGER: a 4xx, not an OverflowError
        assert svc.client.post(f"/v1/actions/{huge}/approve", headers=auth()).status_code == 404
        assert svc.client.get(f"/v1/actions?intent={huge}", headers=auth()).status_code == 400
        # Issue 11 item 3: the webhook token cannot approve, a header cannot name the approver
        forged = {**auth(), "X-Trainwatch-User": "alice"}
        assert svc.client.post(f"/v1/actions/{first}/approve", headers=forged).status_code == 403
        assert svc.client.post(f"/v1/actions/{first}/approve",
                               headers=auth("not-a-known-token")).status_code == 401
        assert svc.client.post(f"/v1/actions/{first}/approve", headers={
            **auth(APPROVERS["bob"]), "X-Trainwatch-User": "mallory"}).status_code == 200
        assert svc.client.post(f"/v1/actions/{second}/reject",
                               headers=auth(APPROVERS["alice"])).status_code == 200
        assert svc.client.post(f"/v1/actions/{second}/approve",
                               headers=auth(APPROVERS["alice"])).status_code == 409
        svc.wait_idle()
        assert [r.path for r in state.posts()] == ["/hook/a"]
        assert {a["decision"] for a in svc.audit()} >= {"approved", "rejected", "acted"}
        assert svc.audit("approved")[0]["reason"] == "approved by bob"
        assert svc.audit("approved")[0]["detail"] == {"approver": "bob", "overrides": []}
        assert svc.audit("rejected")[0]["reason"] == "rejected by alice"


def test_failing_action_retries_then_fails_and_counts(service_factory) -> None:
    book = {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
            "target": ["training_job"],
            "steps": [{"action": "http", "url": "http://127.0.0.1:1/nothing-listens"}]}
    with service_factory([book], max_attempts=2, retry_backoff_seconds=0.05) as svc:
        send(svc, alert("TrainingLossSpike", {"training_job": "a"}))
        svc.wait_idle()
        (failed,) = svc.audit("failed")
        assert failed["detail"]["attempts"] == 2 and failed["action"] == "http"
        text = svc.client.get("/metrics").data.decode()
        assert ('trainwatch_remediation_actions_total{action="http",playbook="page",'
                'result="failed"} 1.0') in text


def test_on_resolve_runs_only_after_the_firing_alert_acted(service_factory) -> None:
    with stub_server() as (hostport, state):
        book = http_book(hostport)
        book["on_resolve"] = [{"action": "http", "url": f"http://{hostport}/restore"}]
        with service_factory([book]) as svc:
            fired = alert("TrainingLossSpike", {"training_job": "a"}, fingerprint="f1")
            send(svc, fired)
            svc.wait_idle()
            send(svc, {**fired, "status": "resolved"})
            svc.wait_idle()
            never_fired = alert("TrainingLossSpike", {"training_job": "b"}, fingerprint="f2",
                                status="resolved")
            send(svc, never_fired)
            svc.wait_idle()
            assert [r.path for r in state.posts()] == ["/hook/a", "/restore"]
            reasons = [a["reason"] for a in svc.audit("resolved_recorded")]
            assert any("never acted on" in r for r in reasons)


def test_cli_lists_and_approves(tmp_path: Path) -> None:
    """`trainwatch actions` / `approve` against a real service process, approving an
    awaiting intent (the older trainwatch-remediation's subcommands, folded in)."""
    from tests.remediation.processes import running_service

    with stub_server() as (hostport, state), running_service(
            tmp_path, [http_book(hostport, requires_approval=True)]) as svc:
        intent = svc.post(payload(alert("TrainingLossSpike", {"training_job": "a"}))).json()[
            "intents"][0]
        wait_until(lambda: svc.actions(state="awaiting_approval")["actions"], timeout=20)
        token_file = tmp_path / "cli.token"
        token_file.write_text(TOKEN)
        cli = [sys.executable, "-m", "trainwatch.remediation.operator"]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
               "TRAINWATCH_REMEDIATION_URL": svc.url, "TRAINWATCH_TOKEN_FILE": str(token_file)}
        listed = subprocess.run([*cli, "actions", "--state", "awaiting_approval"], env=env,
                                capture_output=True, text=True, timeout=30, check=True)
        assert f'"id": {intent}' in listed.stdout
        refused = subprocess.run([*cli, "approve", str(intent)], capture_output=True, env=env,
                                 text=True, timeout=30, check=False)
        assert refused.returncode == 1 and "webhook token cannot approve" in refused.stderr
        approver_file = tmp_path / "alice.token"
        approver_file.write_text(APPROVERS["alice"])
        approver_env = {**env, "TRAINWATCH_TOKEN_FILE": str(approver_file)}
        subprocess.run([*cli, "approve", str(intent)], capture_output=True, env=approver_env,
                       text=True, timeout=30, check=True)
        wait_until(lambda: state.posts(), timeout=20, what="approved action ran")
        approved = svc.actions(decision="approved")["audit"]
        assert approved[0]["reason"] == "approved by alice"
        again = subprocess.run([*cli, "approve", str(intent)], capture_output=True,
                               env=approver_env, text=True, timeout=30, check=False)
        assert again.returncode == 1


def test_truncated_alerts_page_a_human_once(service_factory) -> None:
    with stub_server() as (hostport, state), \
            service_factory([http_book(hostport)], pager_url=f"http://{hostport}/page") as svc:
        body = payload(alert("TrainingLossSpike", {"training_job": "a"}), truncated=3)
        for _ in range(2):  # a resend of the same truncated group pages once
            assert svc.client.post("/v1/alerts", json=body, headers=auth()).status_code == 200
        svc.wait_idle()
        pages = state.posts("/page")
        assert len(pages) == 1 and pages[0].body["event"] == "truncated_alerts"
        assert len(svc.audit("truncated_escalated")) == 1


def test_store_files_are_private(tmp_path: Path) -> None:
    from trainwatch.remediation.store import Store

    store = Store(tmp_path / "s.sqlite")
    assert store.ping()
    for suffix in ("", "-wal", "-shm"):
        assert (tmp_path / f"s.sqlite{suffix}").stat().st_mode & 0o077 == 0
