"""Issue 24: what self-healing saved, per playbook, from a real Prometheus's record of when an
alert's condition began (ALERTS_FOR_STATE holds the pending alert's activeAt)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import requests
from prometheus_client import CollectorRegistry

from tests.support.net import wait_until
from tests.support.procs import prometheus
from trainwatch.exporters.contract import catalog as c
from trainwatch.remediation.recovery import RecoveryTimes, first_evidence

FOR_SECONDS = 3
RULES = f"""
groups:
  - name: probe
    rules:
      - alert: GoodputProbe
        expr: vector(1)
        for: {FOR_SECONDS}s
        labels: {{training_job: job-a}}
"""


def test_time_to_detect_and_recover_from_the_alerts_first_evidence(
        tmp_path: Path, real_binaries: dict[str, str]) -> None:
    (tmp_path / "rules.yml").write_text(RULES)
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                      f"rule_files: [{tmp_path / 'rules.yml'}]\n")
    with prometheus(tmp_path, config) as url:
        def firing() -> list[dict]:
            return requests.get(f"{url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]

        alert = wait_until(lambda: [a for a in firing() if a["state"] == "firing"],
                           timeout=30, what="the probe alert firing")[0]
        fired_at = datetime.now(UTC).timestamp()
        active_at = datetime.fromisoformat(alert["activeAt"]).timestamp()
        session = requests.Session()
        labels = {"alertname": "GoodputProbe", "training_job": "job-a", "severity": "x"}
        evidence = first_evidence(session, url, "GoodputProbe", labels, fired_at)
        # Prometheus keeps activeAt in whole seconds
        assert evidence is not None and 0 <= active_at - evidence < 1.0
        # another job's alert has no evidence here: its alert time stands in
        assert first_evidence(session, url, "GoodputProbe", {**labels, "training_job": "b"},
                              fired_at) is None
        # a name that is not an alert name never reaches Prometheus
        assert first_evidence(session, url, 'x"}or vector(1)', labels, fired_at) is None

        registry = CollectorRegistry()
        times = RecoveryTimes(registry)
        starts_at = datetime.fromtimestamp(active_at + FOR_SECONDS, UTC).isoformat()
        detect, recover = times.observe_intent(session, url, "lr_reduction", "GoodputProbe",
                                               labels, starts_at, active_at + 10.0)
    assert 0 <= detect - FOR_SECONDS < 1.0 and 0 <= recover - 10.0 < 1.0
    for name, value in ((c.REMEDIATION_TIME_TO_DETECT, detect),
                        (c.REMEDIATION_TIME_TO_RECOVER, recover)):
        assert registry.get_sample_value(f"{name}_count", {"playbook": "lr_reduction"}) == 1
        assert registry.get_sample_value(f"{name}_sum", {"playbook": "lr_reduction"}) \
            == value
