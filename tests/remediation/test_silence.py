"""The `silence` action against a real Alertmanager: created for the remediation, expired when
the playbook ends."""

from __future__ import annotations

from pathlib import Path

import requests

from tests.remediation.conftest import make_service
from tests.remediation.helpers import alert, auth, payload, stub_server
from tests.support.procs import alertmanager


def test_silence_is_created_during_and_expired_after_the_playbook(
        tmp_path: Path, real_binaries: dict) -> None:
    am_cfg = tmp_path / "alertmanager.yml"
    am_cfg.write_text("route:\n  receiver: none\nreceivers:\n  - name: none\n")
    with alertmanager(tmp_path, am_cfg) as am_url, stub_server() as (hostport, state):
        book = {"name": "quiet", "match": {"alertname": ["TrainingLossSpike"]},
                "target": ["training_job"],
                "steps": [{"action": "silence", "duration": "10m",
                           "matchers": ["alertname", "training_job"]},
                          {"action": "http", "url": f"http://{hostport}/act"}]}
        with make_service(tmp_path / "svc", [book], alertmanager_url=am_url) as svc:
            resp = svc.client.post("/v1/alerts", json=payload(alert(
                "TrainingLossSpike", {"training_job": "quiet-job"})), headers=auth())
            assert resp.json["accepted"] == 1
            svc.wait_idle()
            (acted,) = svc.audit("acted")
            silence_id = acted["detail"]["results"][0]["result"]["silence_id"]
            silence = requests.get(f"{am_url}/api/v2/silence/{silence_id}", timeout=5).json()
            assert {(m["name"], m["value"]) for m in silence["matchers"]} == {
                ("alertname", "TrainingLossSpike"), ("training_job", "quiet-job")}
            assert silence["createdBy"] == "trainwatch-remediation"
            assert silence["status"]["state"] == "expired"  # expired once the steps finished
            assert len(state.posts("/act")) == 1
