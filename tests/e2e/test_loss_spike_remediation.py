"""End to end, all real: a 2-rank torchrun job's loss spike is cut down by the stack.

Real Prometheus and Alertmanager (Debian binaries), the real training exporter, remediation
service, GPU exporter (simulation mode: no GPU here), log scanner and node_exporter, a real
2-rank gloo job. The only thing this test does by hand is start the processes on free ports
(the Ansible deploy of the same parts is tested in tests/ansible/).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from dashboards.check import FAILURE_ONLY, panel_queries
from scripts.demo_timeline import DemoResult, Endpoints, print_summary, run_spike_demo
from tests.support.net import free_port, wait_until
from tests.support.stack import Stack, running_stack
from trainwatch.exporters.contract.catalog import (
    REMEDIATION_TIME_TO_DETECT,
    REMEDIATION_TIME_TO_RECOVER,
)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]

JOB = "e2e-spike"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("stack")) as running:
        yield running


@pytest.fixture(scope="module")
def demo(stack: Stack) -> DemoResult:
    endpoints = Endpoints(
        prometheus=stack.prometheus, alertmanager=stack.alertmanager,
        training_exporter=stack.training_exporter, remediation=stack.remediation,
        remediation_token=stack.webhook_token, job_env=stack.job_env(JOB))
    lines: list[str] = []
    result = run_spike_demo(endpoints, job=JOB, spike_at=300, steps=560, step_time=0.1,
                            master_port=free_port(), timeout=200, echo=lines.append)
    print_summary(result, endpoints, echo=lines.append)
    print("\n".join(lines))
    return result


def test_unauthenticated_webhook_is_refused_and_changes_nothing(stack: Stack) -> None:
    store = stack.workdir / "remediation.sqlite"
    before = _row_counts(store)
    payload = {
        "version": "4", "status": "firing", "receiver": "remediation", "groupKey": "{}:{}",
        "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "x",
        "truncatedAlerts": 0,
        "alerts": [{"status": "firing", "labels": {"alertname": "TrainingLossSpike",
                                                   "training_job": JOB},
                    "annotations": {}, "startsAt": "2026-11-21T18:03:15.119Z",
                    "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": "f00"}],
    }
    for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": "Basic x"}):
        r = requests.post(f"{stack.remediation}/v1/alerts", json=payload, headers=headers,
                          timeout=5)
        assert r.status_code == 401, (headers, r.status_code, r.text)
    assert _row_counts(store) == before


def test_loss_spike_is_cut_on_every_rank_at_the_same_step(stack: Stack, demo: DemoResult) -> None:
    assert demo.returncode == 0, "the training job must finish cleanly"
    spike = demo.spike_time()
    assert spike is not None, "the job never injected its spike"

    # The alert fired in the real Prometheus, and the webhook reached the remediation service.
    assert demo.alert_fired_at is not None, "TrainingLossSpike never fired"
    assert demo.webhook_at is not None, "the remediation service never received the alert"
    assert demo.intent is not None and demo.intent["playbook"] == "lr_reduction"
    assert demo.intent["state"] == "done", demo.intent

    # The call was authenticated: Alertmanager used the token, and the service accepted it.
    audit = requests.get(f"{stack.remediation}/v1/actions", timeout=5,
                         params={"intent": demo.intent["id"]},
                         headers={"Authorization": f"Bearer {stack.webhook_token}"}).json()
    decisions = [row["decision"] for row in audit["audit"]]
    assert "acted" in decisions, decisions

    # Both ranks applied the cut, at the same step, and report the reduced LR from then on.
    applied = demo.lr_applied()
    assert sorted(applied) == [0, 1], applied
    cut_steps = {e["step"] for e in applied.values()}
    assert len(cut_steps) == 1, f"ranks applied the LR cut at different steps: {applied}"
    cut_step = cut_steps.pop()
    new_lr = applied[0]["lr"]
    assert applied[1]["lr"] == new_lr
    lr_at_spike = demo.events("spike_injected")[0]["lr"]
    assert new_lr == pytest.approx(lr_at_spike * 0.5)
    for rank in (0, 1):
        later = [e for e in demo.events("step") if e["rank"] == rank and e["step"] > cut_step]
        assert later, f"rank {rank} reported no step after the cut"
        assert all(e["lr"] == pytest.approx(new_lr) for e in later), later
    summaries = {e["rank"]: e for e in demo.events("summary")}
    assert summaries[0]["lr"] == summaries[1]["lr"] == pytest.approx(new_lr)

    # The exporter reports the applied command per rank (what Prometheus and Grafana see).
    status = requests.get(
        f"{stack.training_exporter}/v1/jobs/{JOB}/commands/{applied[0]['id']}", timeout=5,
        headers={"Authorization": f"Bearer {stack.control_token_file.read_text().strip()}"})
    assert status.status_code == 200, status.text
    ranks = status.json()["ranks"]
    assert {r: v["step"] for r, v in ranks.items()} == {"0": cut_step, "1": cut_step}

    # Spike to new LR on both ranks, with 1 s scrape/evaluation intervals.
    delay = demo.spike_to_applied_seconds()
    assert delay is not None
    print(f"\nspike -> LR applied on both ranks: {delay:.1f} s")
    assert delay < 15.0, f"took {delay:.1f} s from spike to applied LR (budget 15 s)"

    # Issue 24, acceptance 4: the cut is one observation of lr_reduction's time to recover,
    # from the spike's first evidence (Prometheus's activeAt, in whole seconds) to every rank
    # having applied it (seen within the action's 1 s poll).
    text = requests.get(f"{stack.remediation}/metrics", timeout=5).text
    saved = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
             if s.labels.get("playbook") == "lr_reduction"}
    assert saved[f"{REMEDIATION_TIME_TO_RECOVER}_count"] == 1, saved
    recover = saved[f"{REMEDIATION_TIME_TO_RECOVER}_sum"]
    detect = saved[f"{REMEDIATION_TIME_TO_DETECT}_sum"]
    print(f"time to detect {detect:.1f} s, to recover {recover:.1f} s")
    assert 0 <= detect <= recover <= delay + 3.0, (detect, recover, delay)


def _row_counts(store: Path) -> tuple[int, int]:
    """Rows the refused posts could have written: their fingerprint, or none. Alertmanager
    delivers every alert of the running stack meanwhile (each with its own fingerprint), so
    a count of all rows would change under the test for reasons of its own."""
    mine = "fingerprint IS NULL OR fingerprint IN ('', 'f00')"
    with sqlite3.connect(store) as conn:
        intents = conn.execute(f"SELECT count(*) FROM intents WHERE {mine}").fetchone()[0]  # noqa: S608
        audit = conn.execute(f"SELECT count(*) FROM audit WHERE {mine}").fetchone()[0]  # noqa: S608
    return int(intents), int(audit)


def test_every_dashboard_panel_returns_data(stack: Stack, demo: DemoResult) -> None:
    """Issue 7, acceptance 4: with the demo job run, every panel's queries return data.

    Panels that can only have data during a failure are listed, with the reason, in
    dashboards.check.FAILURE_ONLY; they are still sent to Prometheus, so a broken query fails.
    A panel has data when one of its queries has: a panel over a sparse error counter (served
    from the first error) shows its per-series query empty and its count of holders at 0.
    """
    # Evaluate at a moment the job was still stepping: a finished job's series expire from the
    # exporter (as they should), and the panels are about running jobs.
    at = max(e["time"] for e in demo.events("step"))
    empty = []
    dashboards = sorted((REPO / "dashboards" / "generated").glob("*.json"))
    assert dashboards, "no generated dashboards"
    for path in dashboards:
        dashboard = json.loads(path.read_text())
        queries: dict[str, list[str]] = {}
        with_data = set()
        for title, expr in panel_queries(dashboard):
            r = requests.get(f"{stack.prometheus}/api/v1/query", params={"query": expr, "time": at},
                             timeout=10)
            assert r.status_code == 200, (path.name, title, expr, r.text)
            queries.setdefault(title, []).append(expr)
            if r.json()["data"]["result"]:
                with_data.add(title)
        empty += [f"{path.name} / {title}: {exprs}" for title, exprs in queries.items()
                  if title not in with_data and (dashboard["uid"], title) not in FAILURE_ONLY]
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_trainwatch_status_shows_the_job_its_ranks_alerts_and_the_lr_cut(
        stack: Stack, demo: DemoResult) -> None:
    """Issue 26, acceptance 4: `trainwatch status` against the demo stack, as a table, with its
    settings from the environment: the demo job with its ranks, its open alerts (what
    Prometheus has firing for it), and the LR-cut incident remediation acted on."""
    assert demo.intent is not None and demo.intent["state"] == "done", demo.intent
    token = stack.workdir / "cli-webhook.token"  # reading needs no approver token
    token.write_text(stack.webhook_token)
    token.chmod(0o600)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent",
           "TRAINWATCH_PROMETHEUS_URL": stack.prometheus,
           "TRAINWATCH_REMEDIATION_URL": stack.remediation,
           "TRAINWATCH_TOKEN_FILE": str(token)}
    cli = str(Path(sys.executable).parent / "trainwatch")

    def run(*args: str) -> str:
        done = subprocess.run([cli, *args], capture_output=True, text=True, timeout=60,
                              env=env, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    text = run("status")
    print(text)
    lines = text.splitlines()
    assert lines[0].startswith("JOBS") and lines[1].split()[:3] == ["JOB", "RANKS", "WORLD"]
    (row,) = [line.split() for line in lines if line.startswith(JOB + " ")]
    assert row[1:4] == ["2", "(0,1)", "2"], row
    assert row[6:8] == ["finished", "e2e-node"], row  # every rank closed its monitor
    incidents = lines[lines.index(next(x for x in lines if x.startswith("INCIDENTS"))) + 2:]
    cut = [line.split() for line in incidents if line.split()[:1] == [str(demo.intent["id"])]]
    assert cut and cut[0][1:8] == ["TrainingLossSpike", "lr_reduction",
                                   f"training_job={JOB}", "fire", "done", "act", "yes"], incidents

    def alerts_agree() -> bool:
        (job,) = [j for j in json.loads(run("status", "--json"))["jobs"] if j["job"] == JOB]
        firing = requests.get(f"{stack.prometheus}/api/v1/query", timeout=5, params={
            "query": f'ALERTS{{alertstate="firing",training_job="{JOB}"}}'}).json()
        names = {s["metric"]["alertname"] for s in firing["data"]["result"]}
        assert job["ranks"] == [0, 1] and job["nodes"] == ["e2e-node"]
        return set(job["open_alerts"]) >= names  # node alerts of its node count too

    wait_until(alerts_agree, timeout=30, what="the CLI's open alerts to match Prometheus")
    (job_row,) = [j for j in json.loads(run("jobs", "--json")) if j["job"] == JOB]
    assert job_row["step"] >= max(e["step"] for e in demo.events("step"))
