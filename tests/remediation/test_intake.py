"""Webhook intake: authentication, limits, schema, idempotency, and what is recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.remediation.helpers import (
    REPO,
    TOKEN,
    alert,
    auth,
    payload,
    write_config,
    write_playbook,
)
from trainwatch.remediation.config import ConfigError, load_config
from trainwatch.remediation.playbooks import PlaybookError, load_playbooks
from trainwatch.remediation.store import Store

PAGE = {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
        "target": ["training_job"],
        "steps": [{"action": "http", "url": "http://127.0.0.1:1/${labels.training_job}"}]}


def test_real_alertmanager_025_payload_is_accepted(service_factory) -> None:
    """A payload captured from a real Alertmanager 0.25 (tests/remediation/data/)."""
    body = (Path(__file__).parent / "data" / "alertmanager-0.25-webhook-firing.json").read_text()
    with service_factory([PAGE], start_worker=False) as svc:
        resp = svc.client.post("/v1/alerts", data=body, headers=auth(),
                               content_type="application/json")
        assert resp.status_code == 200
        assert resp.json["unmatched"] == 1
        assert svc.audit("unmatched")[0]["alertname"] == "AlwaysFiring"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": "Basic dGVzdA=="},
                                     {"Authorization": "Bearer "}])
def test_missing_or_bad_token_is_401_and_records_nothing(service_factory, headers) -> None:
    with service_factory([PAGE], start_worker=False) as svc:
        resp = svc.client.post("/v1/alerts", json=payload(alert("TrainingLossSpike",
                               {"training_job": "j"})), headers=headers)
        assert resp.status_code == 401
        assert svc.store.list_intents() == []
        assert svc.client.get("/v1/actions", headers=headers).status_code == 401


def test_oversized_body_is_413(service_factory) -> None:
    with service_factory([PAGE], start_worker=False, max_body_bytes=4096) as svc:
        big = payload(alert("TrainingLossSpike", {"training_job": "j", "x": "y" * 5000}))
        resp = svc.client.post("/v1/alerts", json=big, headers=auth())
        assert resp.status_code == 413
        assert svc.store.list_intents() == []


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"version": "3", "status": "firing",'
                                  b' "alerts": []}', json.dumps({"version": "4", "status":
                                  "firing", "alerts": {"labels": {}}}).encode()])
def test_invalid_payload_is_400_so_alertmanager_does_not_retry(service_factory, body) -> None:
    with service_factory([PAGE], start_worker=False) as svc:
        resp = svc.client.post("/v1/alerts", data=body, headers=auth(),
                               content_type="application/json")
        assert resp.status_code == 400
        assert "error" in resp.json
        assert svc.store.list_intents() == []


def test_one_bad_alert_does_not_block_its_neighbours(service_factory) -> None:
    """Issue 11 item 5: an oversize annotation or a missing field is recorded as invalid with
    the reason, the valid alert beside it is accepted, and the answer is 200 (Alertmanager
    drops a 4xx, so a 400 would lose the valid alert)."""
    with service_factory([PAGE], start_worker=False, max_body_bytes=65536) as svc:
        good = alert("TrainingLossSpike", {"training_job": "good"})
        oversize = alert("TrainingLossSpike", {"training_job": "big"})
        oversize["annotations"]["description"] = "x" * 5000
        body = payload(good, oversize, {"labels": {"alertname": "NoFingerprint"}})
        body["commonAnnotations"] = {"description": "x" * 5000}  # as Alertmanager repeats it
        resp = svc.client.post("/v1/alerts", json=body, headers=auth())
        assert resp.status_code == 200, resp.data
        assert resp.json["accepted"] == 1 and resp.json["invalid"] == 2
        invalid = svc.audit("invalid")
        assert len(invalid) == 2
        assert any("annotations/description" in r["reason"] for r in invalid)
        assert any("is a required property" in r["reason"] for r in invalid)
        (pending,) = svc.store.list_intents(state="pending")
        assert pending["labels"]["training_job"] == "good"
        again = svc.client.post("/v1/alerts", json=body, headers=auth())
        assert again.status_code == 200 and len(svc.audit("invalid")) == 2  # not re-audited


def test_lone_surrogate_is_recorded_invalid_not_503(service_factory) -> None:
    """Issue 11 item 5: a lone surrogate (valid JSON escape, invalid Unicode) in alertname, a
    label or the group key gave 503, which Alertmanager retries forever."""
    with service_factory([PAGE], start_worker=False) as svc:
        raw = json.dumps(payload(alert("SURROGATE", fingerprint="5e"),
                                 alert("TrainingLossSpike", {"training_job": "SURROGATE"}),
                                 alert("TrainingLossSpike", {"training_job": "fine"})))
        raw = raw.replace("SURROGATE", "\\ud800").replace('"{}:{}"', '"\\udfff"')
        resp = svc.client.post("/v1/alerts", data=raw, headers=auth(),
                               content_type="application/json")
        assert resp.status_code == 200, resp.data
        assert resp.json["invalid"] == 2 and resp.json["accepted"] == 1
        reasons = [r["reason"] for r in svc.audit("invalid")]
        assert all("not valid Unicode" in r for r in reasons), reasons
        listed = svc.client.get("/v1/actions", headers=auth())
        assert listed.status_code == 200


def test_store_failure_is_the_only_5xx(service_factory) -> None:
    """When nothing can be recorded (the store is full) the answer is 503, so Alertmanager
    retries; /readyz says so too."""
    with service_factory([PAGE], start_worker=False, store_max_bytes=65536) as svc:
        code = 200
        for n in range(400):
            body = payload(*[alert("TrainingLossSpike", {"training_job": f"j{n}",
                                                         "pad": "p" * 3000}) for _ in range(4)])
            code = svc.client.post("/v1/alerts", json=body, headers=auth()).status_code
            if code != 200:
                break
        assert code == 503
        ready = svc.client.get("/readyz")
        assert ready.status_code == 503
        assert any("commit" in p for p in ready.json["problems"]), ready.json


def test_unknown_extra_fields_are_accepted(service_factory) -> None:
    with service_factory([PAGE], start_worker=False) as svc:
        body = payload(alert("TrainingLossSpike", {"training_job": "j"}))
        body["newField"] = {"anything": 1}
        body["alerts"][0]["newAlertField"] = [1, 2]
        assert svc.client.post("/v1/alerts", json=body, headers=auth()).json["accepted"] == 1


def test_redelivery_is_deduplicated_and_audited(service_factory, store_section) -> None:
    with service_factory([PAGE], start_worker=False, **store_section) as svc:
        body = payload(alert("TrainingLossSpike", {"training_job": "j"}, fingerprint="aa"))
        answers = [svc.client.post("/v1/alerts", json=body, headers=auth()).json
                   for _ in range(3)]
        assert [a["accepted"] for a in answers] == [1, 0, 0]
        assert len(svc.store.list_intents()) == 1
        dups = svc.audit("deduplicated")
        assert len(dups) == 2 and {d["intent_id"] for d in dups} == {answers[0]["intents"][0]}


def test_missing_target_label_is_refused_fail_closed(service_factory) -> None:
    with service_factory([PAGE], start_worker=False) as svc:
        resp = svc.client.post("/v1/alerts", json=payload(alert("TrainingLossSpike")),
                               headers=auth())
        assert resp.status_code == 200 and resp.json["refused"] == 1
        (refusal,) = svc.audit("refused")
        assert "missing target label 'training_job'" in refusal["reason"]
        assert svc.store.state_counts() == {"refused": 1}


@pytest.mark.parametrize("value", ["a;rm -rf /", "../../etc", "$(id)", "-e", "a b", "`x`", ""])
def test_hostile_label_values_are_refused(service_factory, value) -> None:
    with service_factory([PAGE], start_worker=False) as svc:
        resp = svc.client.post("/v1/alerts", json=payload(alert("TrainingLossSpike",
                               {"training_job": value})), headers=auth())
        assert resp.status_code == 200 and resp.json["refused"] == 1
        assert svc.store.state_counts() == {"refused": 1}


def test_resolved_alert_is_recorded_not_acted(service_factory) -> None:
    with service_factory([PAGE], start_worker=False) as svc:
        resp = svc.client.post("/v1/alerts", json=payload(alert(
            "TrainingLossSpike", {"training_job": "j"}, status="resolved")), headers=auth())
        assert resp.json["resolved"] == 1 and resp.json["accepted"] == 0
        (rec,) = svc.audit("resolved_recorded")
        assert "no on_resolve" in rec["reason"]
        assert svc.store.state_counts() == {"done": 1}


def test_truncated_alerts_are_recorded_and_escalated(service_factory) -> None:
    with service_factory([PAGE], start_worker=False) as svc:
        body = payload(alert("TrainingLossSpike", {"training_job": "j"}), truncated=7)
        assert svc.client.post("/v1/alerts", json=body, headers=auth()).status_code == 200
        (rec,) = svc.audit("truncated_escalated")
        assert rec["detail"]["truncatedAlerts"] == 7
        metrics = svc.client.get("/metrics").data.decode()
        assert ('trainwatch_remediation_decisions_total{decision="truncated_escalated"} 1.0'
                in metrics)


def test_audit_table_is_append_only(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    with store.transaction() as tx:
        tx.audit("acted", reason="x")
    import sqlite3

    with pytest.raises(sqlite3.IntegrityError, match="append-only"), store.transaction() as tx:
        tx.execute("UPDATE audit SET reason='forged'")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"), store.transaction() as tx:
        tx.execute("DELETE FROM audit")


def test_health_ready_metrics(service_factory) -> None:
    with service_factory([PAGE]) as svc:
        assert svc.client.get("/healthz").status_code == 200
        ready = svc.client.get("/readyz")
        assert ready.status_code == 200 and ready.json["playbooks"] == ["page"]
        text = svc.client.get("/metrics").data.decode()
        assert "trainwatch_remediation_circuit_breaker_open 0.0" in text


def test_shipped_playbooks_validate_and_cover_the_contract() -> None:
    books = load_playbooks(REPO / "remediation" / "playbooks")
    # the contract's playbooks; more may ship (a new playbook is one file, CONTRIBUTING.md)
    assert set(books) >= {"lr_reduction", "checkpoint_rollback", "disk_cleanup",
                          "gpu_power_limit", "stalled_job_diagnostics"}
    assert books["lr_reduction"].alertnames == {"TrainingLossSpike", "TrainingGradNormExplosion"}
    assert books["gpu_power_limit"].on_resolve
    assert books["gpu_power_limit"].target == ("node", "gpu")
    for book in books.values():
        for step in (*book.steps, *book.on_resolve):
            if step["action"] == "ansible":
                assert (REPO / "ansible" / "playbooks" / "remediation" / step["playbook"]).is_file()


def test_bad_playbook_names_file_and_key(tmp_path: Path) -> None:
    write_playbook(tmp_path, {"name": "x", "match": {"alertname": ["A"]}, "target": ["node"],
                              "steps": [{"action": "ansible", "playbook": "../evil.yml"}]})
    with pytest.raises(PlaybookError, match=r"x\.yaml: steps/0"):
        load_playbooks(tmp_path)


def test_bad_config_names_file_and_key(tmp_path: Path) -> None:
    path = write_config(tmp_path, port="ninety")
    with pytest.raises(ConfigError, match=r"remediation\.yml: port"):
        load_config(path)
    raw = yaml.safe_load(path.read_text())
    raw["port"] = 1
    raw["surprise"] = True
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="surprise"):
        load_config(path)
    proc = subprocess.run([sys.executable, "-m",
                           "trainwatch.remediation.server", "--config", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "surprise" in proc.stderr


LR_STEP = {"action": "training_command", "command": "scale_lr"}


@pytest.mark.parametrize(("change", "fragment"), [
    ({"steps": [{**LR_STEP, "args": {"factor": float("nan")}}]}, "steps/0/args/factor"),
    ({"steps": [{**LR_STEP, "args": {"factor": 0.5, "floor": float("inf")}}]}, "floor"),
    ({"steps": [{**LR_STEP, "args": {"factor": 5}}]}, "factor"),
    ({"steps": [{"action": "training_command", "command": "rollback",
                 "args": {"skip_batches": -3}}]}, "skip_batches"),
    ({"cooldown": float("nan")}, "cooldown"),
    ({"rate_limit": {"count": 2, "window": float("inf")}}, "rate_limit/window"),
    ({"steps": [{"action": "ansible", "playbook": "gpu_power_limit.yml",
                 "vars": {"reduce_by_percent": float("nan")}}]}, "reduce_by_percent"),
])
def test_non_finite_or_out_of_bounds_playbook_numbers_are_refused(
        tmp_path: Path, change: dict, fragment: str) -> None:
    """Issue 25 item 5, playbook boundary: YAML's .nan/.inf (and a training command's
    arguments out of the exporter's bounds) stop the playbook from loading, naming the key.
    On the code before the fix `factor: .nan` loaded and was sent to every rank."""
    write_playbook(tmp_path, {"name": "lr", "match": {"alertname": ["TrainingLossSpike"]},
                              "target": ["training_job"], "steps": [LR_STEP], **change})
    text = (tmp_path / "lr.yaml").read_text()
    assert ".nan" in text or ".inf" in text or "nan" not in str(change)
    with pytest.raises(PlaybookError, match=fragment):
        load_playbooks(tmp_path)


def test_non_finite_config_numbers_and_webhook_literals_are_refused(tmp_path: Path,
                                                                     service_factory) -> None:
    """Issue 25 item 5, config and webhook: a NaN passes `"exclusiveMinimum": 0` (every
    comparison with it is false), so `poll_interval_seconds: .nan` loaded on the code before
    the fix; a NaN literal in a webhook body is a 400 like any other non-JSON."""
    path = write_config(tmp_path / "cfg")
    raw = yaml.safe_load(path.read_text())
    raw["poll_interval_seconds"] = float("nan")
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="poll_interval_seconds: must be a finite number"):
        load_config(path)
    with service_factory([PAGE], start_worker=False) as svc:
        body = json.dumps(payload(alert("TrainingLossSpike", {"training_job": "j"})))
        body = body[:-1] + ', "weight": NaN}'
        resp = svc.client.post("/v1/alerts", data=body, headers=auth(),
                               content_type="application/json")
        assert resp.status_code == 400 and "finite" in resp.json["error"]
        assert svc.store.list_intents() == []


def test_approver_file_holds_digests_and_refuses_the_webhook_token(tmp_path: Path) -> None:
    """Issue 11 item 3: approver tokens are made by the tool and stored hashed; a file that
    would let the webhook token approve stops the service at start."""
    import hashlib

    approvers = tmp_path / "team-approvers"
    made = subprocess.run([sys.executable, "-m", "trainwatch.remediation.approvers", "add", "carol",
                           "--file", str(approvers)], capture_output=True, text=True,
                          timeout=60, check=True, cwd=REPO)
    token = made.stdout.strip()
    assert len(token) >= 32 and token not in approvers.read_text()
    assert approvers.stat().st_mode & 0o077 == 0
    config = load_config(write_config(tmp_path, approvers_file=str(approvers)))
    assert config.approvers.identify(token) == "carol"
    assert config.approvers.identify(token + "x") is None
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    approvers.write_text(f"mallory sha256:{digest}\n")
    with pytest.raises(ConfigError, match="webhook token"):
        load_config(write_config(tmp_path, approvers_file=str(approvers)))
    approvers.write_text("bad line\n")
    with pytest.raises(ConfigError, match=r"team-approvers:1"):
        load_config(write_config(tmp_path, approvers_file=str(approvers)))
