"""Quarantine on a real Slurm cluster (issue 23): the adapter, and the rails of acceptance 3.

Every Slurm command the service runs goes through recording wrappers (tests/slurm/fixtures.py)
that exec the real scontrol/sinfo/squeue, so "called once to drain" is a count of real calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.remediation.conftest import Service, make_service
from tests.remediation.helpers import APPROVERS, alert, auth, payload, stub_server
from tests.slurm.cluster import SlurmCluster
from tests.slurm.fixtures import (
    HOSTS,
    calls,
    drains,
    job_nodes,
    quarantine_book,
    requeues,
    service_overrides,
    submit,
)
from tests.support.net import wait_until
from trainwatch.remediation.config import SchedulerSettings
from trainwatch.remediation.schedulers.base import SchedulerError
from trainwatch.remediation.schedulers.slurm import SlurmScheduler

NODE_HOST = {node: host for host, node in HOSTS.items()}


def running_on(cluster: SlurmCluster, job_id: str, timeout: float = 60) -> list[str]:
    """Wait until the job runs; the scheduler nodes it runs on."""
    scheduler = SlurmScheduler(SchedulerSettings(slurm_conf=cluster.conf))
    try:
        wait_until(lambda: job_nodes(cluster, job_id)[0] == "RUNNING", timeout=timeout,
                   interval=0.2, what=f"job {job_id} running")
    except TimeoutError as exc:
        queue = cluster.run(["squeue", "--format=%i %T %r %N %S"]).stdout
        record = cluster.run(["scontrol", "show", "job", job_id]).stdout
        outputs = "".join(p.read_text(errors="replace")[-2000:]
                          for p in cluster.root.glob(f"job-{job_id}.out"))
        raise AssertionError(f"{exc}\n{queue}\n{record}\n{outputs}\n{cluster.logs()}") from exc
    return [n for n in cluster.nodes if any(j.job_id == job_id for j in scheduler.jobs_on(n))]


@contextmanager
def services(tmp_path: Path, cluster: SlurmCluster, books: list[dict[str, Any]], *,
             replicas: int = 1, **rails: Any) -> Iterator[tuple[list[Service], Path, Any]]:
    """`replicas` remediation services sharing one store, the scheduler config pointing at
    the test cluster through the recording bin dir, and a pager stand-in."""
    with ExitStack() as stack:
        pager, pager_state = stack.enter_context(stub_server())
        overrides, log = service_overrides(tmp_path, cluster, pager, **rails)
        store = tmp_path / "shared.sqlite"
        svcs = [stack.enter_context(make_service(
            tmp_path / f"replica{i}", books, store_path=str(store), **overrides))
            for i in range(replicas)]
        yield svcs, log, pager_state


def deliver(svc: Service, *alerts: dict[str, Any]) -> None:
    resp = svc.client.post("/v1/alerts", json=payload(*alerts), headers=auth())
    assert resp.status_code == 200, resp.get_json()


def settings(cluster: SlurmCluster) -> SchedulerSettings:
    return SchedulerSettings(slurm_conf=cluster.conf, command_timeout_seconds=60)


def test_adapter_drains_requeues_and_resumes_only_its_own_drain(slurm: SlurmCluster) -> None:
    scheduler = SlurmScheduler(settings(slurm))
    job = submit(slurm)
    first, _ = running_on(slurm, job)
    out = scheduler.drain(first, "GpuLost intent 7: quarantine; rm -rf / `x` $(y)")
    assert out["drained"] is True
    assert slurm.node_reason(first).startswith("trainwatch: GpuLost intent 7: quarantine")
    assert "`" not in slurm.node_reason(first) and "$" not in slurm.node_reason(first)
    assert scheduler.drain(first, "again")["drained"] == "already"
    [running] = scheduler.jobs_on(first)
    assert scheduler.requeue(running)["requeued"] is True
    now = running_on(slurm, job)
    assert first not in now and len(now) == 2
    assert scheduler.resume(first)["resumed"] is True
    wait_until(lambda: "drain" not in slurm.node_state(first), timeout=30, what="resumed")
    # a node drained by someone else is theirs: never resumed by Trainwatch
    spare = next(n for n in slurm.nodes if n not in now)
    slurm.run(["scontrol", "update", f"NodeName={spare}", "State=DRAIN", "Reason=bad fan"])
    with pytest.raises(SchedulerError, match="someone else"):
        scheduler.resume(spare)
    # defence in depth: the adapter refuses a hostlist even if a caller passed one
    with pytest.raises(ValueError, match="hostlist"):
        scheduler.drain("tw-gpu-[01-03]", "x")
    assert all("drain" not in slurm.node_state(n) for n in now)


def test_one_fault_two_alerts_two_replicas_redelivered_one_drain_one_requeue(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """XID 79, then GpuLost, for one GPU: both Alertmanagers deliver both alerts (twice) to
    both replicas. One drain, one requeue; the job runs on without the node."""
    job = submit(slurm)
    bad = running_on(slurm, job)[0]
    host = NODE_HOST[bad]
    xid = alert("GpuXidErrors", {"node": host, "gpu": "0", "xid": "79"},
                fingerprint="0f1e2d3c4b5a6978")
    lost = alert("GpuLost", {"node": host, "gpu": "0"}, fingerprint="8796a5b4c3d2e1f0")
    with services(tmp_path, slurm, [quarantine_book()], replicas=2,
                  min_healthy_fraction=0.5) as (svcs, log, _):
        for _ in range(2):
            for svc in svcs:
                deliver(svc, xid)
        for _ in range(2):
            for svc in svcs:
                deliver(svc, lost)
        for svc in svcs:
            svc.wait_idle(90)
        audit = svcs[0].audit()
        decided = [(a["decision"], a["reason"]) for a in audit
                   if a["decision"] != "deduplicated"]
        assert len(drains(log)) == 1, (calls(log), decided)
        assert len(requeues(log)) == 1, calls(log)
        assert [a["decision"] for a in audit].count("acted") == 1
        assert [a["decision"] for a in audit].count("already_quarantined") == 1
    reason = slurm.node_reason(bad)
    assert reason.startswith("trainwatch: GpuXidErrors XID 79 intent") or reason.startswith(
        "trainwatch: GpuLost intent"), reason
    assert "quarantine" in reason
    now = running_on(slurm, job)
    assert bad not in now and len(now) == 2


def test_rails_second_node_waits_for_approval_and_pages(slurm: SlurmCluster,
                                                        tmp_path: Path) -> None:
    """Faults on two of three nodes inside the window, min_healthy_fraction 0.5: the first
    node is drained, the second is not: its intent waits for approval and the on-call is
    paged; an approver's approval then drains it."""
    first, second = "tw-gpu-01", "tw-gpu-02"
    with services(tmp_path, slurm, [quarantine_book()], min_healthy_fraction=0.5,
                  max_quarantined=5, quarantine_window="1h") as (svcs, log, pager):
        svc = svcs[0]
        deliver(svc, alert("GpuLost", {"node": NODE_HOST[first], "gpu": "0"}))
        svc.wait_idle(60)
        deliver(svc, alert("GpuLost", {"node": NODE_HOST[second], "gpu": "1"}))
        svc.wait_idle(60)
        assert [c[1] for c in drains(log)] == [f"NodeName={first}"]
        assert "drain" in slurm.node_state(first)
        assert "drain" not in slurm.node_state(second)
        [waiting] = svc.audit("awaiting_approval")
        assert "min_healthy_fraction" in waiting["reason"]
        # the page goes out after the decision is committed: wait for it
        pages = wait_until(lambda: [p.body for p in pager.posts("/page")], timeout=30,
                           what="the page")
        assert [p["event"] for p in pages] == ["quarantine_awaiting_approval"]
        assert second in pages[0]["summary"]
        resp = svc.client.post(f"/v1/actions/{waiting['intent_id']}/approve",
                               headers=auth(APPROVERS["alice"]))
        assert resp.status_code == 200, resp.get_json()
        svc.wait_idle(60)
        assert len(drains(log)) == 2
        assert "drain" in slurm.node_state(second)


def test_max_quarantined_per_window(slurm: SlurmCluster, tmp_path: Path) -> None:
    with services(tmp_path, slurm, [quarantine_book()], min_healthy_fraction=0.0,
                  max_quarantined=1) as (svcs, log, pager):
        svc = svcs[0]
        deliver(svc, alert("GpuLost", {"node": "node-a", "gpu": "0"}))
        svc.wait_idle(60)
        deliver(svc, alert("GpuLost", {"node": "node-b", "gpu": "0"}))
        svc.wait_idle(60)
        assert len(drains(log)) == 1
        [waiting] = svc.audit("awaiting_approval")
        assert "max_quarantined 1" in waiting["reason"]
        wait_until(lambda: len(pager.posts("/page")) == 1, timeout=30, what="the page")


def test_observe_only_changes_nothing_and_says_what_it_would_do(slurm: SlurmCluster,
                                                                tmp_path: Path) -> None:
    job = submit(slurm)
    bad = running_on(slurm, job)[0]
    book = quarantine_book(observe_only=True)
    with services(tmp_path, slurm, [book]) as (svcs, log, pager):
        svc = svcs[0]
        deliver(svc, alert("GpuLost", {"node": NODE_HOST[bad], "gpu": "0"}))
        svc.wait_idle(60)
        assert not [c for c in calls(log) if c[0] == "scontrol"]
        [observed] = svc.audit("observe_only")
        assert observed["reason"].startswith(f"observe-only: would drain {bad} and requeue")
        assert observed["detail"]["plan"]["fault"]["nodes"] == [bad]
        pages = wait_until(lambda: pager.posts("/page"), timeout=30, what="the page")
        assert [p.body["event"] for p in pages] == ["quarantine_observe_only"]
    assert "drain" not in slurm.node_state(bad)
    assert job_nodes(slurm, job)[0] == "RUNNING" and bad in running_on(slurm, job)


@pytest.mark.parametrize("value", ["all", "node-d", "tw-gpu-01", "gpu-[01-64]",
                                   "node-a,node-b", "node-*"])
def test_pattern_or_unknown_node_label_is_refused_before_any_command(
        slurm: SlurmCluster, tmp_path: Path, value: str) -> None:
    """`all`, a name outside the mapping, a scheduler node name given as the label, a
    hostlist, a list and a glob: refused and audited, and no Slurm command ran at all."""
    with services(tmp_path, slurm, [quarantine_book()]) as (svcs, log, _):
        svc = svcs[0]
        deliver(svc, alert("GpuLost", {"node": value, "gpu": "0"}))
        svc.wait_idle(60)
        [refused] = svc.audit("refused")
        assert "node" in refused["reason"]
        assert calls(log) == []
    assert all(slurm.node_state(n) == "idle" for n in slurm.nodes)


def test_application_xid_drains_nothing(slurm: SlurmCluster, tmp_path: Path) -> None:
    with services(tmp_path, slurm, [quarantine_book()]) as (svcs, log, _):
        svc = svcs[0]
        deliver(svc, alert("GpuXidErrors", {"node": "node-a", "gpu": "0", "xid": "13"}))
        svc.wait_idle(60)
        [record] = svc.audit("not_actionable")
        assert "application" in record["detail"]["plan"]["fault"]["class"]
        assert not [c for c in calls(log) if c[0] == "scontrol"]


def test_contained_error_restarts_the_job_without_draining(slurm: SlurmCluster,
                                                           tmp_path: Path) -> None:
    """XID 94 (contained memory error: the catalog's RESTART_APP): the job is requeued and
    restarts at once; no node is drained."""
    job = submit(slurm)
    node = running_on(slurm, job)[0]
    with services(tmp_path, slurm, [quarantine_book()]) as (svcs, log, _):
        svc = svcs[0]
        deliver(svc, alert("GpuXidErrors", {"node": NODE_HOST[node], "gpu": "0", "xid": "94"}))
        svc.wait_idle(60)
        [acted] = svc.audit("acted")
        fault = acted["detail"]["results"][0]["result"]["plan"]["fault"]
        assert (fault["class"], fault["action"]) == ("contained", "restart")
        assert drains(log) == [] and len(requeues(log)) == 1
    assert all("drain" not in slurm.node_state(n) for n in slurm.nodes)
    running_on(slurm, job)  # restarted at once: the requeue hold was lifted
    record = slurm.run(["scontrol", "show", "job", job]).stdout
    assert "Restarts=1" in record


def test_node_down_acts_only_on_a_node_that_runs_a_job(slurm: SlurmCluster,
                                                        tmp_path: Path) -> None:
    job = submit(slurm)
    busy = running_on(slurm, job)
    idle = next(n for n in slurm.nodes if n not in busy)
    with services(tmp_path, slurm, [quarantine_book(alertnames=("NodeDown",))],
                  min_healthy_fraction=0.3) as (svcs, log, _):
        svc = svcs[0]
        deliver(svc, alert("NodeDown", {"node": NODE_HOST[idle]}))
        svc.wait_idle(60)
        [record] = svc.audit("not_actionable")
        assert "hosts no job" in record["reason"]
        deliver(svc, alert("NodeDown", {"node": NODE_HOST[busy[0]]}))
        svc.wait_idle(60)
        assert [c[1] for c in drains(log)] == [f"NodeName={busy[0]}"]
        assert len(requeues(log)) == 1
