"""The restart rails of the quarantine action, on both stores, without a scheduler: one death
reported twice (each dying rank's alert, the exporter's fast alert and the rule's) restarts
its job once; a death that began after the restart, or that ended the job again, restarts it
again, up to max_restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.remediation.helpers import write_config
from trainwatch.remediation.actions.base import RailsContext
from trainwatch.remediation.actions.quarantine import (
    RESTART_GRANTS,
    QuarantinePlan,
    granted,
    rails,
    stopped_jobs,
)
from trainwatch.remediation.config import SchedulerSettings, load_config
from trainwatch.remediation.decisions import Decision
from trainwatch.remediation.faults import Fault
from trainwatch.remediation.schedulers.base import Job
from trainwatch.remediation.store import NewIntent, Store
from trainwatch.remediation.stores import open_store

JOB = "4242"


def killed_rank_plan(intent_id: int, fault_at: float, ended: bool) -> QuarantinePlan:
    fault = Fault("TrainingJobVanished", "killed", "restart", ("tw-gpu-01",),
                  "a rank died without a word", ends_job=True)
    return QuarantinePlan(intent_id, fault, ("tw-gpu-01", "tw-gpu-02"), (), jobs=(JOB,),
                          fault_at=fault_at, ended=(JOB,) if ended else ())


def decide(store: Store, fault_at: float, now: float, ended: bool = False) -> Decision | None:
    """The rails for one more alert of the job's death, and the grant if they let it act."""
    settings = SchedulerSettings()
    context = RailsContext(approved=False, approved_rails=frozenset(), observe_only=False,
                           now=now, alertname="TrainingJobVanished")
    with store.transaction() as tx:
        intent_id = tx.insert_intent(NewIntent(
            fingerprint=f"f{fault_at}", starts_at="t", playbook="job_restart", phase="fire",
            alertname="TrainingJobVanished", labels={}, annotations={}, target_key=JOB,
            state="done"))
        plan = killed_rank_plan(intent_id, fault_at, ended)
        verdict = rails(tx, plan, settings, context)
        if verdict is None:
            granted(tx, plan, settings, now, context.alertname)
            return None
        return verdict.decision


def test_one_death_seen_twice_restarts_once_and_a_later_death_restarts_again(
        tmp_path: Path, store_section: dict[str, Any]) -> None:
    store = open_store(load_config(write_config(tmp_path, **store_section)))
    died = 1_000_000.0
    assert decide(store, fault_at=died, now=died + 3) is None  # rank 1's alert: restart
    # rank 0's alert (killed by the scheduler right after) and the rule's alert of the same
    # death, both begun before the restart
    assert decide(store, fault_at=died + 1.5, now=died + 4) == Decision.ALREADY_RESTARTED
    assert decide(store, fault_at=died + 2, now=died + 40) == Decision.ALREADY_RESTARTED
    # the restarted job dies again a minute later: a new fault
    assert decide(store, fault_at=died + 60, now=died + 63) is None
    # and again, seconds after its restart, already ended when planned: a new fault too
    assert decide(store, fault_at=died + 65, now=died + 68, ended=True) is None
    # the fourth death in the window: max_restarts (3) reached, a person decides
    assert decide(store, fault_at=died + 180, now=died + 183,
                  ended=True) == Decision.RESTART_LIMITED
    with store.transaction() as tx:
        assert len(tx.grant_history(RESTART_GRANTS, died - 1, JOB)) == 3


class CompletingJobScheduler:
    """A scripted stand-in for the Slurm adapter's two readings (no scheduler runs here):
    the job reads as running, then for a few polls as neither running nor ended (Slurm's
    COMPLETING before the exit code is its reason), then as ended by the fault. Each poll
    reads ended_jobs, then jobs_on; the state moves on after jobs_on."""

    def __init__(self, polls_in_between: int, seen_running: bool = True) -> None:
        first = ["running"] if seen_running else []
        self.readings = [*first, *["completing"] * polls_in_between, "failed"]

    def jobs_on(self, node: str) -> list[Job]:
        state = self.readings[0]
        if len(self.readings) > 1:
            self.readings.pop(0)
        return [Job(JOB, "running", node)] if state == "running" else []

    def ended_jobs(self, node: str, job_id: str | None = None) -> list[Job]:
        return [Job(JOB, "failed", node)] if self.readings[0] == "failed" else []


def test_a_job_between_running_and_ended_is_waited_for_not_lost() -> None:
    plan = killed_rank_plan(1, fault_at=1_000_000.0, ended=False)
    stopped = stopped_jobs(CompletingJobScheduler(polls_in_between=2), plan, wait_seconds=10)
    assert [job.job_id for job in stopped.ended] == [JOB]
    assert stopped.ending == []


def test_a_job_the_plan_saw_is_waited_for_when_the_step_finds_it_in_between() -> None:
    """The plan read the job running (plan.jobs); a second later the step's first reading
    finds it COMPLETING, in neither reading: still waited for until it reads as ended, not
    left (benchmarks/recovery.py's first kill waited 135 s for the rule's alert that way)."""
    plan = killed_rank_plan(1, fault_at=1_000_000.0, ended=False)
    scheduler = CompletingJobScheduler(polls_in_between=3, seen_running=False)
    stopped = stopped_jobs(scheduler, plan, wait_seconds=10)
    assert [job.job_id for job in stopped.ended] == [JOB]



class XidEndedJobScheduler(CompletingJobScheduler):
    """The same script for a fatal XID that took its rank's process: at the quarantine's
    step the job is already COMPLETING (listed by completing_jobs only), then ended."""

    def completing_jobs(self, node: str) -> list[Job]:
        state = self.readings[0]
        if len(self.readings) > 1:
            self.readings.pop(0)
        return [Job(JOB, "completing", node)] if state == "completing" else []


def test_a_node_quarantine_waits_for_a_job_its_fault_is_ending() -> None:
    """A fatal XID drains its node; the step finds the job neither running nor ended (the
    rank died with the GPU, Slurm ends the job): it waits for the job to read as ended by the
    fault and brings it back, instead of draining only (benchmarks/recovery.py attempt 6b:
    only the dying rank's own alert requeued it)."""
    fault = Fault("GpuXidErrors", "hardware", "quarantine", ("tw-gpu-01",), "XID 48",
                  ends_job=False)
    plan = QuarantinePlan(1, fault, ("tw-gpu-01", "tw-gpu-02"), ("tw-gpu-01",),
                          fault_at=1_000_000.0)
    scheduler = XidEndedJobScheduler(polls_in_between=3, seen_running=False)
    stopped = stopped_jobs(scheduler, plan, wait_seconds=10)
    assert [job.job_id for job in stopped.ended] == [JOB]
    assert stopped.running == []
