"""The quarantine against a scheduler that is not on its side: a node someone else owns, a
command that answers garbage, a slurmctld that is away. Real Slurm (the session's test
cluster); the recording wrappers (tests/slurm/fixtures.py) count every real call and inject
the garbage answers.

- ownership: a node drained, down or in a maintenance reservation by someone else is never
  drained over, requeued on or resumed; the refusal is audited and paged;
- read-back and strict parsing: an scontrol that prints "ok", exits 0 and drains nothing, and
  an squeue whose answer does not parse, are failures that are retried and paged, never
  `acted`;
- the scheduler away: slurmctld stopped at the fault and started again 60 s later, the fault
  is healed once after it returns; past the deadline the intent fails and pages, and the same
  alert delivered again is tried again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.remediation.helpers import alert
from tests.slurm.cluster import SlurmCluster
from tests.slurm.fixtures import (
    calls,
    drains,
    inject_fault,
    job_nodes,
    quarantine_book,
    requeues,
    scontrol_calls,
    submit,
)
from tests.slurm.test_quarantine import NODE_HOST, deliver, running_on, services, settings
from tests.support.net import wait_until
from trainwatch.remediation.actions.quarantine import Diagnostics, QuarantinePlan, jobs_to_requeue
from trainwatch.remediation.faults import Fault, StallRecord
from trainwatch.remediation.resume import main as resume_main
from trainwatch.remediation.schedulers.base import NodeNotOurs, NodeState, SchedulerError
from trainwatch.remediation.schedulers.slurm import SlurmScheduler

PERSON = "PSU swap, burn-in pending"
OUTAGE_SECONDS = 60.0  # issue 35's acceptance: slurmctld back 60 s after the fault


def _take(cluster: SlurmCluster, node: str, how: str) -> None:
    """A person takes `node` out of service: drained, down, or a maintenance reservation."""
    if how == "reservation":
        out = cluster.run(["scontrol", "create", "reservation", "ReservationName=burnin",
                           "StartTime=now", "Duration=60", "Users=root", "Flags=MAINT",
                           f"Nodes={node}"])
        assert out.returncode == 0, out.stderr
        wait_until(lambda: cluster.node_state(node) != "idle", timeout=30,
                   what="the reservation in the node's state")
    else:
        out = cluster.run(["scontrol", "update", f"NodeName={node}",
                           f"State={how.upper()}", f"Reason={PERSON}"])
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("how", ["drain", "down", "reservation"])
def test_the_adapter_never_touches_a_node_someone_else_has_out_of_service(
        slurm: SlurmCluster, how: str) -> None:
    scheduler = SlurmScheduler(settings(slurm))
    node = slurm.nodes[2]
    _take(slurm, node, how)
    try:
        before = (slurm.node_state(node), slurm.node_reason(node))
        with pytest.raises(NodeNotOurs, match="someone else"):
            scheduler.drain(node, "GpuLost intent 12: quarantine")
        with pytest.raises(NodeNotOurs, match="someone else"):
            scheduler.resume(node)
        # state and reason as the person left them
        assert (slurm.node_state(node), slurm.node_reason(node)) == before
        assert scheduler.node_states((node,))[node].someone_elses
    finally:
        slurm.run(["scontrol", "delete", "ReservationName=burnin"])


def test_node_states_of_a_restarting_controller_count_as_in_service() -> None:
    """What sinfo printed here for every node in the first seconds after slurmctld started
    (`unknown`), and for a node that has not answered yet (`idle*`): not out of service, so
    the healthy-fraction rail does not hold a quarantine for approval because of them. Slurm
    itself marks a node that stays silent `down` (SlurmdTimeout), which counts."""
    for state in ("unknown", "idle*", "allocated*", "mixed"):
        assert NodeState("n", state, "none").in_service, state
    for state in ("down*", "down", "drained", "draining", "idle$", "maint", "reserved", "fail"):
        assert not NodeState("n", state, "none").in_service, state


def test_a_persons_drain_is_never_taken_over_and_never_resumed(
        slurm: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A person drains a node that still runs a job; a GPU on it is then lost. Trainwatch
    writes no reason over the person's, requeues nothing, audits and pages the refusal; and
    trainwatch-resume-node refuses to return the node (audited, paged)."""
    job = submit(slurm)
    node = running_on(slurm, job)[0]
    _take(slurm, node, "drain")
    with services(tmp_path, slurm, [quarantine_book()], min_healthy_fraction=0.0) as (
            svcs, log, pager):
        svc = svcs[0]
        deliver(svc, alert("GpuLost", {"node": NODE_HOST[node], "gpu": "0"}))
        svc.wait_idle(60)
        [refused] = svc.audit("node_not_ours")
        assert PERSON in refused["reason"] and node in refused["reason"]
        assert not svc.audit("acted") and not svc.audit("failed")
        assert scontrol_calls(log) == []
        pages = wait_until(lambda: [p.body for p in pager.posts("/page")], timeout=30,
                           what="the page")
        assert [p["event"] for p in pages] == ["quarantine_node_not_ours"]
        # the person's node, asked back through trainwatch-resume-node: refused
        config = tmp_path / "replica0" / "remediation.yml"
        assert resume_main(["--config", str(config), NODE_HOST[node]]) == 1
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["resumed"] is False and PERSON in out["reason"]
        [audited] = [a for a in svc.audit("node_not_ours") if a["action"] == "resume_node"]
        assert PERSON in audited["reason"]
        wait_until(lambda: [p.body["event"] for p in pager.posts("/page")][1:] == [
            "node_not_ours"], timeout=30, what="the resume refusal's page")
        assert scontrol_calls(log) == []
    assert slurm.node_reason(node) == PERSON
    assert job_nodes(slurm, job)[0] == "RUNNING" and node in running_on(slurm, job)


def test_an_scontrol_that_answers_ok_and_drains_nothing_fails_and_pages(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """scontrol prints "ok" and exits 0 without draining: the drain does not read back, so
    the step fails, is retried until the deadline, fails and pages; never `acted`."""
    job = submit(slurm)
    node = running_on(slurm, job)[0]
    with services(tmp_path, slurm, [quarantine_book()], min_healthy_fraction=0.0,
                  retry_until="1s", retry_backoff_max="0.2s") as (svcs, log, pager):
        svc = svcs[0]
        inject_fault(log.parent, "scontrol", "ok\n")
        deliver(svc, alert("GpuLost", {"node": NODE_HOST[node], "gpu": "0"}))
        [failed] = wait_until(lambda: svc.audit("failed"), timeout=120, what="failed")
        assert "reads back" in failed["reason"] and failed["detail"]["attempts"] >= 2
        assert not svc.audit("acted")
        assert len(drains(log)) >= 2  # tried again
        pages = wait_until(lambda: [p.body for p in pager.posts("/page")], timeout=30,
                           what="the page")
        assert [p["event"] for p in pages] == ["quarantine_failed"]
        assert "reads back" in pages[0]["summary"]
        inject_fault(log.parent, "scontrol", None)
    assert "drain" not in slurm.node_state(node)
    assert job_nodes(slurm, job)[0] == "RUNNING"


@pytest.mark.parametrize("garbage", ["", "Segmentation fault (core dumped)\n"])
def test_squeue_output_that_does_not_parse_is_not_no_jobs(
        slurm: SlurmCluster, tmp_path: Path, garbage: str) -> None:
    """squeue answers nothing at all, or garbage, with exit status 0 after the drain: not "no
    jobs" (the job would be left on the drained node); the step fails and is retried, and
    once squeue answers again the job is requeued, once."""
    job = submit(slurm)
    node = running_on(slurm, job)[0]
    with services(tmp_path, slurm, [quarantine_book()], min_healthy_fraction=0.0,
                  retry_backoff_max="0.5s") as (svcs, log, _):
        svc = svcs[0]
        inject_fault(log.parent, "squeue", garbage)
        deliver(svc, alert("GpuLost", {"node": NODE_HOST[node], "gpu": "0"}))
        wait_until(lambda: sum(1 for c in calls(log) if c[0] == "squeue") >= 3, timeout=60,
                   what="squeue asked again after its unparseable answers")
        assert not svc.audit("acted")
        assert "drain" in slurm.node_state(node) and job_nodes(slurm, job)[0] == "RUNNING"
        inject_fault(log.parent, "squeue", None)
        [acted] = wait_until(lambda: svc.audit("acted"), timeout=60, what="acted")
        result = acted["detail"]["results"][0]["result"]
        assert result["drain"]["drained"] == "already"  # the retry found its own drain
        assert [r["job"] for r in result["requeued"]] == [job]
        assert len(drains(log)) == 1 and len(requeues(log)) == 1
    assert node not in running_on(slurm, job)


def _attempts(svc: Any) -> int:
    """The attempts of the service's newest intent."""
    newest = svc.store.list_intents(1, None)
    return int(newest[0]["attempts"]) if newest else 0


@pytest.mark.slow
def test_slurmctld_away_at_the_fault_the_fault_is_healed_once_when_it_returns(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """slurmctld stopped at the fault, started again 60 s later: the intent keeps trying
    (more tries than the service's max_attempts, which used to give up after ~33 s), and once
    slurmctld answers the node is drained once and the job requeued once; nothing waits for
    approval although every node reads `unknown` for a few seconds after the restart."""
    job = submit(slurm)
    node = running_on(slurm, job)[0]
    with services(tmp_path, slurm, [quarantine_book()], min_healthy_fraction=0.6,
                  command_timeout="5s", retry_backoff_max="1s") as (svcs, log, pager):
        svc = svcs[0]
        slurm.stop_controller()
        try:
            stopped = time.monotonic()
            deliver(svc, alert("GpuLost", {"node": NODE_HOST[node], "gpu": "0"}))
            wait_until(lambda: time.monotonic() - stopped >= OUTAGE_SECONDS
                       and _attempts(svc) > svc.config.max_attempts,
                       timeout=OUTAGE_SECONDS + 60, interval=1,
                       what="the outage, with the intent still trying")
            assert not svc.audit("failed") and not svc.audit("acted")
        finally:
            slurm.start_controller()
        [acted] = wait_until(lambda: svc.audit("acted"), timeout=120, what="healed")
        assert not svc.audit("awaiting_approval") and not svc.audit("failed")
        assert [c[1] for c in drains(log)] == [f"NodeName={node}"]
        assert len(requeues(log)) == 1
        assert acted["detail"]["results"][0]["result"]["requeued"][0]["job"] == job
        assert pager.posts("/page") == []
    assert "drain" in slurm.node_state(node)
    assert node not in running_on(slurm, job, timeout=120)


@pytest.mark.slow
def test_past_the_deadline_it_pages_and_the_fault_firing_again_is_tried_again(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """slurmctld away longer than retry_until: the intent fails and pages. The alert is
    still firing: delivered again (the same fingerprint and startsAt), it is not
    deduplicated away but tried again, and heals now that slurmctld is back."""
    job = submit(slurm)
    node = running_on(slurm, job)[0]
    fault = alert("GpuLost", {"node": NODE_HOST[node], "gpu": "0"})
    with services(tmp_path, slurm, [quarantine_book()], min_healthy_fraction=0.0,
                  command_timeout="3s", retry_until="1s") as (svcs, log, pager):
        svc = svcs[0]
        slurm.stop_controller()
        try:
            deliver(svc, fault)
            [failed] = wait_until(lambda: svc.audit("failed"), timeout=120, what="failed")
            pages = wait_until(lambda: [p.body for p in pager.posts("/page")], timeout=30,
                               what="the page")
            assert [p["event"] for p in pages] == ["quarantine_failed"]
        finally:
            slurm.start_controller()
        deliver(svc, fault)
        [retried] = svc.audit("retried")
        assert retried["intent_id"] == failed["intent_id"]
        assert not svc.audit("deduplicated")
        [acted] = wait_until(lambda: svc.audit("acted"), timeout=120, what="healed")
        assert acted["intent_id"] == failed["intent_id"]
        assert len(drains(log)) == 1 and len(requeues(log)) == 1
    assert node not in running_on(slurm, job, timeout=120)


def test_a_drain_reason_that_names_no_intent_is_refused(slurm: SlurmCluster) -> None:
    """Every reason Trainwatch writes names its intent, or it could not tell later that the
    drain is its own."""
    with pytest.raises(SchedulerError, match="names no intent"):
        SlurmScheduler(settings(slurm)).drain(slurm.nodes[0], "GpuLost: quarantine")
    assert "drain" not in slurm.node_state(slurm.nodes[0])


def test_a_stall_requeues_its_own_slurm_job_only(slurm: SlurmCluster) -> None:
    """The stall's diagnostics record carries its ranks' SLURM_JOB_ID: of the jobs on the
    suspect node, that one is requeued; a record naming another job, or none, requeues
    nothing there (a job that did not stall keeps running)."""
    job = submit(slurm)
    node = running_on(slurm, job)[0]
    scheduler = SlurmScheduler(settings(slurm))

    def plan(scheduler_jobs: tuple[str, ...] | None) -> QuarantinePlan:
        record = None if scheduler_jobs is None else StallRecord(
            {"suspects": ["1"]}, {1: (NODE_HOST[node],)}, (), scheduler_jobs)
        fault = Fault("TrainingStalled", "hang", "quarantine", (node,), "stalled")
        return QuarantinePlan(1, fault, slurm.nodes, (), diagnostics=Diagnostics(1, record))

    assert jobs_to_requeue(scheduler, plan((job,)))[0] == scheduler.jobs_on(node)
    for other in (("999999",), (), None):
        jobs, why = jobs_to_requeue(scheduler, plan(other))
        assert jobs == [], why
    # not a stall (a lost GPU): every job on the node stopped with it
    lost = QuarantinePlan(1, Fault("GpuLost", "hardware", "quarantine", (node,), "lost"),
                          slurm.nodes, ())
    assert [j.job_id for j in jobs_to_requeue(scheduler, lost)[0]] == [job]
