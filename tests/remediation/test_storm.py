"""Acceptance 5: a storm of 500 distinct alerts against a real service process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from tests.remediation.helpers import alert, payload, stub_server
from tests.remediation.processes import running_service
from tests.support.net import wait_until

JOBS = 20
BREAKER = 30
PER_JOB = 2


def test_storm_of_500_alerts_is_bounded_and_fully_accounted(tmp_path: Path,
                                                           store_section: dict) -> None:
    with stub_server() as (hostport, state):
        book = {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
                "target": ["training_job"], "rate_limit": {"count": PER_JOB, "window": "1h"},
                "steps": [{"action": "http", "url": f"http://{hostport}/act/${{labels.training_job}}"}]}
        with running_service(tmp_path, [book], worker_threads=4, **store_section,
                             circuit_breaker={"max_actions": BREAKER, "window": "1h"}) as svc:
            alerts = [alert("TrainingLossSpike", {"training_job": f"job{i % JOBS}", "n": str(i)})
                      for i in range(480)]
            alerts += [alert("TrainingLossSpike", {"n": str(i)}) for i in range(20)]  # no target
            batches = [payload(*alerts[i:i + 5]) for i in range(0, len(alerts), 5)]
            with ThreadPoolExecutor(8) as pool:
                codes = list(pool.map(lambda b: svc.post(b).status_code, batches))
            assert codes == [200] * len(batches)

            def settled() -> dict | None:
                actions = svc.actions(limit=1000)["actions"]
                done = [a for a in actions if a["state"] not in ("pending", "running")]
                return actions if len(done) == 500 else None

            intents = wait_until(settled, timeout=90, what="all 500 alerts decided")
            assert requests.get(f"{svc.url}/healthz", timeout=5).status_code == 200

            decisions: dict[str, int] = {}
            for intent in intents:
                decisions[intent["decision"]] = decisions.get(intent["decision"], 0) + 1
            assert sum(decisions.values()) == 500
            assert decisions["act"] == BREAKER == len(state.posts("/act"))
            per_job: dict[str, int] = {}
            for post in state.posts("/act"):
                per_job[post.path] = per_job.get(post.path, 0) + 1
            assert max(per_job.values()) <= PER_JOB
            assert set(decisions) <= {"act", "rate_limited", "refused"}
            audit = svc.actions(limit=5000)["audit"]
            reasons = {r["intent_id"]: r["reason"] for r in audit
                       if r["decision"] in ("rate_limited", "refused")}
            assert len(reasons) == 500 - BREAKER  # every non-acted alert has its reason
            assert sum("circuit breaker open" in r for r in reasons.values()) > 0
            assert sum("missing target label" in r for r in reasons.values()) == 20
            metrics = requests.get(f"{svc.url}/metrics", timeout=5).text
            assert "trainwatch_remediation_circuit_breaker_open 1.0" in metrics
