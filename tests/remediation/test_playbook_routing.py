"""Routing follows the playbooks: Alertmanager sends every alert to the webhook
(alert_rules/alertmanager.yml.j2), the playbook files decide which act, and the rest are
recorded as `unmatched`. So a playbook that needs no host work is one YAML file."""

from __future__ import annotations

from alert_rules.config import load_raw
from tests.remediation.helpers import alert, auth, payload, write_config
from trainwatch.remediation.config import load_config
from trainwatch.remediation.playbooks import load_playbooks


def test_every_shipped_playbook_answers_alerts_the_rule_config_defines(tmp_path) -> None:
    configured = set(load_raw()["defaults"]["alerts"])
    books = load_playbooks(load_config(write_config(tmp_path)).playbooks_dir)
    assert books
    for book in books.values():
        assert book.alertnames <= configured, (book.name, book.alertnames - configured)


def test_an_alert_no_playbook_matches_is_recorded_unmatched(service_factory) -> None:
    with service_factory() as svc:
        resp = svc.client.post("/v1/alerts", json=payload(alert("TargetDown", {"job": "x"})),
                               headers=auth())
        assert resp.status_code == 200 and resp.json["unmatched"] == 1
        (row,) = svc.audit("unmatched")
        assert row["alertname"] == "TargetDown" and not row["playbook"]
