"""Quarantine that operators can trust, on the real Slurm test cluster: a grant only for a
drain that holds (a node returned by trainwatch-resume-node and faulting again is drained again
at once; a lemon node stays out and is listed), held quarantines that outlive their alert,
rails for restarts, pages off the workers' path, approvals that re-check every rail.

The store-bound cases run on SQLite and on PostgreSQL (the `store_section` fixture)."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, redirect_stdout
from datetime import datetime, timezone
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from tests.remediation.conftest import (  # noqa: F401 - pg_cluster, store_section: fixtures
    Service,
    make_service,
    pg_cluster,
    store_section,
)
from tests.remediation.helpers import APPROVERS, alert, auth, payload, stub_server
from tests.remediation.trickle import TricklingServer
from tests.slurm.cluster import SlurmCluster
from tests.slurm.fixtures import (
    HOSTS,
    drains,
    quarantine_book,
    recording_bin,
    requeues,
    submit,
    write_inventory,
)
from tests.slurm.test_quarantine import running_on
from tests.support.net import wait_until
from tests.support.procs import prometheus
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.node.gpu.fake_nvml import simulated_scenario
from trainwatch.remediation.resume import main as resume_main

NODE_HOST = {node: host for host, node in HOSTS.items()}


@contextmanager
def service(tmp_path: Path, cluster: SlurmCluster, books: list[dict[str, Any]],
            store: dict[str, Any] | None = None, *, pager: str | None = None,
            prometheus_url: str | None = None, extra: dict[str, Any] | None = None,
            **rails: Any
            ) -> Iterator[tuple[Service, Path, Any]]:
    """One remediation service on `store`, its scheduler config pointing at the test cluster
    through the recording bin dir, an inventory whose hosts pass node_health_check against
    the fake NVML, and a pager stand-in (or `pager`)."""
    with ExitStack() as stack:
        pager_addr, pager_state = stack.enter_context(stub_server())
        bin_dir, log = recording_bin(tmp_path / "bin")
        nvml = {}
        for host in HOSTS:
            nvml[host] = tmp_path / f"nvml-{host}.json"
            nvml[host].write_text(json.dumps(simulated_scenario(2, dynamic=False)))
        inventory = write_inventory(tmp_path / "hosts.yml", {
            host: {"trainwatch_python": sys.executable, "trainwatch_fake_nvml": str(nvml[host]),
                   "trainwatch_health_burn_seconds": 0, "trainwatch_expect_gpus": 2}
            for host in HOSTS})
        overrides: dict[str, Any] = {
            "ansible_inventory": str(inventory),
            "pager_url": pager or f"http://{pager_addr}/page",
            "scheduler": {"kind": "slurm", "bin_dir": str(bin_dir),
                          "slurm_conf": str(cluster.conf), "command_timeout": "60s", **rails},
            **(store or {}),
            **(extra or {}),
        }
        if prometheus_url:
            overrides["prometheus_url"] = prometheus_url
        svc = stack.enter_context(make_service(tmp_path / "svc", books, **overrides))
        yield svc, log, pager_state


def deliver(svc: Service, *alerts: dict[str, Any]) -> None:
    resp = svc.client.post("/v1/alerts", json=payload(*alerts), headers=auth())
    assert resp.status_code == 200, resp.get_json()


def fault(host: str, n: int, alertname: str = "GpuLost", now: bool = False,
          **labels: str) -> dict[str, Any]:
    """The n-th fault of `host`: a new alert (its own startsAt), as Alertmanager sends a
    fault that fired again after it resolved; `now`: it starts now (a restart's rails tell
    a new fault from one a restart already healed by when it began)."""
    starts_at = (datetime.now(timezone.utc).isoformat().replace("+00:00", "Z") if now
                 else f"2026-11-21T18:{n:02d}:00.000Z")
    return alert(alertname, {"node": host, "gpu": "0", **labels},
                 fingerprint=hashlib.sha256(f"{host} {alertname}".encode()).hexdigest()[:16],
                 starts_at=starts_at)


def decisions(svc: Service) -> list[str]:
    return [a["decision"] for a in reversed(svc.audit()) if a["decision"] != "deduplicated"]


def resume(svc: Service, host: str) -> tuple[int, str]:
    """trainwatch-resume-node on the service's own config file."""
    out = StringIO()
    with redirect_stdout(out):
        rc = resume_main(["--config", str(svc_config_path(svc)), host])
    return rc, out.getvalue()


def svc_config_path(svc: Service) -> Path:
    return svc.config.store_path.parent / "remediation.yml"


def metric(svc: Service, name: str, node: str) -> float | None:
    text = svc.client.get("/metrics").get_data(as_text=True)
    prefix = f'{name}{{node="{node}"}} '
    found = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(found[0][len(prefix):]) if found else None


@pytest.mark.slow
def test_a_returned_node_that_faults_again_is_drained_again_and_a_lemon_stays_out(
        slurm: SlurmCluster, tmp_path: Path, store_section: dict[str, Any]) -> None:  # noqa: F811
    """Fault, resume (trainwatch-resume-node: health check passed), fault again: drained again
    within the time of the first fault. The third fault in the window drains it, pages, and
    trainwatch-resume-node refuses it; /metrics lists it (the lemon-node series)."""
    with ExitStack() as stack:
        exporter, _ = stack.enter_context(stub_server())
        prom_config = tmp_path / "prometheus.yml"
        prom_config.write_text(json.dumps({"global": {"scrape_interval": "1s"},
                                           "scrape_configs": [{"job_name": "gpu",
                                                               "static_configs": [
                                                                   {"targets": [exporter]}]}]}))
        prom_url = stack.enter_context(prometheus(tmp_path, prom_config))
        svc, log, pager = stack.enter_context(service(
            tmp_path, slurm, [quarantine_book()], store_section, prometheus_url=prom_url,
            min_healthy_fraction=0.0, max_quarantined=5, lemon_faults=3))
        bad = slurm.nodes[0]
        host = NODE_HOST[bad]
        took = []
        for n in (1, 2, 3):
            started = time.monotonic()
            deliver(svc, fault(host, n))
            wait_until(lambda n=n: len(drains(log)) == n, timeout=60, what=f"drain {n}")
            took.append(time.monotonic() - started)
            wait_until(lambda: "drain" in slurm.node_state(bad), timeout=30, what="drained")
            svc.wait_idle(60)
            if n < 3:
                rc, out = resume(svc, host)
                assert rc == 0, out
                wait_until(lambda: "drain" not in slurm.node_state(bad), timeout=30,
                           what="resumed")
        assert decisions(svc).count("acted") == 3 and "already_quarantined" not in decisions(svc)
        assert took[1] <= 3 * took[0] + 10, took  # again at once, not after the window
        # the third fault in the window: kept out, paged, listed
        rc, out = resume(svc, host)
        assert rc == 1 and "kept out" in out, out
        assert "drain" in slurm.node_state(bad)
        pages = wait_until(lambda: pager.posts("/page"), timeout=30, what="the lemon page")
        assert [p.body["event"] for p in pages] == ["quarantine_lemon_node"]
        assert metric(svc, catalog.REMEDIATION_NODE_FAULTS, bad) == 3
        assert metric(svc, catalog.REMEDIATION_NODE_KEPT_OUT, bad) == 1
        assert metric(svc, catalog.REMEDIATION_NODE_FAULT_INTERVAL, bad) is not None


def test_a_failed_drain_ends_its_grant(slurm: SlurmCluster, tmp_path: Path,
                                       store_section: dict[str, Any]) -> None:  # noqa: F811
    """A drain that failed for good holds no grant: the node's next fault drains it."""
    bad = slurm.nodes[0]
    host = NODE_HOST[bad]
    # a scheduler that fails keeps being tried until retry_until (sched36): keep that short
    with service(tmp_path, slurm, [quarantine_book()], store_section,
                 min_healthy_fraction=0.0, retry_until="1s",
                 retry_backoff_max="0.2s") as (svc, log, _):
        scontrol = tmp_path / "bin" / "scontrol"
        working = scontrol.read_text()
        scontrol.write_text("#!/bin/sh\necho 'scontrol: error: injected' >&2\nexit 1\n")
        deliver(svc, fault(host, 1))
        wait_until(lambda: svc.audit("failed"), timeout=60, what="the drain failed for good")
        scontrol.write_text(working)
        deliver(svc, fault(host, 2))
        svc.wait_idle(60)
        assert "already_quarantined" not in decisions(svc)
        assert len(drains(log)) == 1 and "drain" in slurm.node_state(bad)


def test_a_held_quarantine_outlives_its_alert_until_approved(
        slurm: SlurmCluster, tmp_path: Path, store_section: dict[str, Any]) -> None:  # noqa: F811
    """XID 79 held for approval (max_quarantined 0); GpuXidErrors resolves by itself; the
    hold stays, and approving it then drains the node."""
    bad = slurm.nodes[0]
    xid = fault(NODE_HOST[bad], 1, "GpuXidErrors", xid="79")
    with service(tmp_path, slurm, [quarantine_book()], store_section, max_quarantined=0,
                 min_healthy_fraction=0.0) as (svc, log, _):
        deliver(svc, xid)
        svc.wait_idle(60)
        [held] = svc.audit("awaiting_approval")
        deliver(svc, {**xid, "status": "resolved", "endsAt": "2026-11-21T19:00:00Z"})
        svc.wait_idle(60)
        assert svc.store.get_intent(held["intent_id"]).state == "awaiting_approval"
        resp = svc.client.post(f"/v1/actions/{held['intent_id']}/approve",
                               headers=auth(APPROVERS["alice"]))
        assert resp.status_code == 200, resp.get_json()
        assert resp.get_json()["overrides"] == ["max_quarantined"]
        svc.wait_idle(60)
        assert len(drains(log)) == 1 and "drain" in slurm.node_state(bad)


def test_a_hold_nobody_decides_expires_with_a_page(
        slurm: SlurmCluster, tmp_path: Path, store_section: dict[str, Any]) -> None:  # noqa: F811
    bad = slurm.nodes[0]
    xid = fault(NODE_HOST[bad], 1, "GpuXidErrors", xid="79")
    with service(tmp_path, slurm, [quarantine_book()], store_section, max_quarantined=0,
                 min_healthy_fraction=0.0, hold_expiry="1s",
                 extra={"lease_seconds": 3}) as (svc, log, pager):
        deliver(svc, xid)
        wait_until(lambda: svc.audit("awaiting_approval"), timeout=60, what="held")
        deliver(svc, {**xid, "status": "resolved", "endsAt": "2026-11-21T19:00:00Z"})
        wait_until(lambda: svc.audit("expired"), timeout=60, what="the hold expired")
        pages = wait_until(lambda: [p.body["event"] for p in pager.posts("/page")
                                    if p.body["event"] == "hold_expired"],
                           timeout=30, what="the expiry page")
        assert pages == ["hold_expired"]
        [held] = svc.audit("awaiting_approval")
        assert svc.store.get_intent(held["intent_id"]).state == "cancelled"
        assert drains(log) == []


def test_restart_only_faults_restart_a_job_at_most_max_restarts_then_page(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """Contained XID 94 again and again on one job's node: requeued max_restarts times in the
    window, then the on-call is paged instead."""
    job = submit(slurm, nodes=3)  # on every node, whichever order it restarts in
    node = running_on(slurm, job)[0]
    with service(tmp_path, slurm, [quarantine_book()], max_restarts=2) as (svc, log, pager):
        for n in (1, 2, 3):
            running_on(slurm, job)
            deliver(svc, fault(NODE_HOST[node], n, "GpuXidErrors", now=True, xid="94"))
            svc.wait_idle(60)
        assert len(requeues(log)) == 2 and drains(log) == []
        [limited] = svc.audit("restart_limited")
        assert job in limited["reason"] and "max_restarts 2" in limited["reason"]
        pages = wait_until(lambda: pager.posts("/page"), timeout=30, what="the page")
        assert [p.body["event"] for p in pages] == ["quarantine_restart_limited"]


def test_a_slow_pager_delays_no_action(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A quarantine held for approval pages a pager that trickles its answer; an unrelated
    action on the one worker thread still runs at once."""
    with TricklingServer() as pager, stub_server() as (hook, hook_state):
        books = [quarantine_book(),
                 {"name": "notify", "match": {"alertname": ["DiskFull"]},
                  "target": ["node"],
                  "steps": [{"action": "http", "url": f"http://{hook}/hook"}]}]
        with service(tmp_path, slurm, books, pager=pager.url, max_quarantined=0,
                     min_healthy_fraction=0.0, extra={"worker_threads": 1,
                                                      "request_timeout_seconds": 60}
                     ) as (svc, _, _):
            deliver(svc, fault("node-a", 1, "GpuLost"))
            wait_until(lambda: svc.audit("awaiting_approval"), timeout=60, what="held")
            started = time.monotonic()
            deliver(svc, alert("DiskFull", {"node": "node-b"}))
            wait_until(lambda: hook_state.posts("/hook"), timeout=60, what="the hook")
            assert time.monotonic() - started < 20
            assert svc.client.get("/readyz").status_code == 200


def test_an_approval_rechecks_every_rail(slurm: SlurmCluster, tmp_path: Path,
                                         store_section: dict[str, Any]) -> None:  # noqa: F811
    """B is held for max_quarantined only; before anyone approves, a person drains C, so
    draining B would leave no node in service. The approval (of max_quarantined) does not
    skip min_healthy_fraction: B stays held, and the page names both rails."""
    a, b, c = slurm.nodes
    with service(tmp_path, slurm, [quarantine_book()], store_section, max_quarantined=1,
                 min_healthy_fraction=0.3) as (svc, log, pager):
        deliver(svc, fault(NODE_HOST[a], 1))
        svc.wait_idle(60)
        deliver(svc, fault(NODE_HOST[b], 2))
        svc.wait_idle(60)
        [held] = svc.audit("awaiting_approval")
        assert held["detail"]["rails"] == ["max_quarantined"]
        slurm.run(["scontrol", "update", f"NodeName={c}", "State=DRAIN", "Reason=bad fan"])
        resp = svc.client.post(f"/v1/actions/{held['intent_id']}/approve",
                               headers=auth(APPROVERS["alice"]))
        assert resp.status_code == 200 and resp.get_json()["overrides"] == ["max_quarantined"]
        wait_until(lambda: len(svc.audit("awaiting_approval")) == 2, timeout=60,
                   what="held again")
        again = svc.audit("awaiting_approval")[0]
        assert again["detail"]["rails"] == ["max_quarantined", "min_healthy_fraction"]
        assert [d[1] for d in drains(log)] == [f"NodeName={a}"]
        assert "drain" not in slurm.node_state(b)
        pages = wait_until(lambda: [p.body for p in pager.posts("/page")][1:], timeout=30,
                           what="the second page")
        assert pages[-1]["rails"] == ["max_quarantined", "min_healthy_fraction"]
        assert "max_quarantined" in pages[-1]["summary"]
        assert "min_healthy_fraction" in pages[-1]["summary"]
