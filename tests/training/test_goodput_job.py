"""Issue 24, acceptance 1 and 2: a real 2-rank torchrun job (CPU, gloo) spends its time on
every goodput cause, and the exporter's counters match what the test measured itself.

The job (tests/training/jobs/goodput_worker.py) starts, reads 20 slow batches (0.2 s each),
saves checkpoints at steps 50, 100 and 150 (synchronously), is rolled back by a posted
`rollback` command from about step 70 to step 50, stalls 60 s at step 120 (rank 1 sleeps, rank
0 waits in the gradient all-reduce), and is killed after step 170 (agent and ranks, SIGKILL).
The test relaunches it; the new incarnation resumes from step 150 and finishes. Meanwhile the
exporter is restarted once (acceptance 2: no reset, no double count). The test measures every
cause with the job's own clocks and the processes' start times from /proc, then compares:
each cause within 5 % or 1 s, the kinds adding up to wall within 1 %, discarded seconds equal
to the time of the steps the rollback and the restart threw away.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.net import wait_until
from tests.training.goodput_support import Measured, launch, newest_step, node_totals, starts
from tests.training.support import JOB_BASE_ENV, events, exporter, of
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract import goodput as gp

pytestmark = pytest.mark.slow
JOB = "goodput-job"
STALL_SECONDS = 60.0
ROLLBACK_FROM = 70
KILL_AFTER = 170
ARGS = ("--steps", "260", "--step-time", "0.05", "--slow-data-steps", "20-39",
        "--data-delay", "0.2", "--save-at", "50,100,150", "--stall-rank", "1",
        "--stall-at-step", "120", "--stall-seconds", str(STALL_SECONDS))


def test_every_second_of_a_restarted_rolled_back_stalled_job_is_counted(
        tmp_path: Path) -> None:
    state = tmp_path / "goodput.db"
    measured = Measured()
    e = measured.expected
    with exporter(tmp_path, extra=("--goodput-state", str(state))) as exp:
        env = {**JOB_BASE_ENV, **exp.job_env(JOB)}
        first = launch(tmp_path, "first", env, ARGS)
        try:
            start1 = starts(first)
            wait_until(lambda: newest_step(first) >= ROLLBACK_FROM, timeout=180,
                       what=f"step {ROLLBACK_FROM}")
            posted = exp.api("POST", f"/v1/jobs/{JOB}/commands",
                             json={"id": "rb-1", "type": "rollback", "args": {}})
            assert posted.status_code == 202, posted.text
            wait_until(lambda: len(of(events(first), "rolled_back")) == 2, timeout=60,
                       what="rollback applied on both ranks")
            # Acceptance 2: an exporter restart neither resets nor double counts.
            wait_until(lambda: newest_step(first) >= 110, timeout=60, what="step 110")
            before = node_totals(exp, JOB)
            exp.restart()
            after = wait_until(lambda: (t := node_totals(exp, JOB)).get("wall", 0) > 0 and t,
                               timeout=30, what="goodput served after the exporter restart")
            assert all(after[k] >= before[k] for k in before), (before, after)
            wait_until(lambda: of(events(first), "stalled"), timeout=STALL_SECONDS + 60,
                       what="the stall")
            wait_until(lambda: min(newest_step(first, 0), newest_step(first, 1)) >= KILL_AFTER,
                       timeout=120, what=f"step {KILL_AFTER} after the stall")
            pids = [s["pid"] for s in of(events(first), "start")]
            # the ranks at once (torchrun's workers run in sessions of their own), then the
            # agent (it restarts nothing: no --max-restarts)
            killed_at = time.time()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            first.kill9()
            found1 = events(first)
        finally:
            first.stop()
        before_relaunch = wait_until(lambda: node_totals(exp, JOB), timeout=10, what="totals")
        second = launch(tmp_path, "second", env, ARGS)
        try:
            start2 = starts(second)
            wait_until(lambda: not second.alive(), timeout=240, what="relaunched job finished")
            assert second.proc.returncode == 0, second.log_text()[-3000:]
            wait_until(lambda: exp.by_rank(catalog.TRAINING_FINISHED, JOB) == {"0": 1.0,
                                                                                 "1": 1.0},
                       timeout=30, what="both ranks' final datagrams")
            totals = node_totals(exp, JOB)
            found2 = events(second)
        finally:
            second.stop()
    closed = {c["rank"]: c["wall"] for c in of(found2, "closed")}

    # --- what the test measured ------------------------------------------------------------
    last1 = {r: of(found1, "step", rank=r)[-1] for r in (0, 1)}
    one = measured.launch(found1, start1, {r: killed_at for r in (0, 1)})
    two = measured.launch(found2, start2, closed)
    e["downtime"] = sum(start2[r] - killed_at for r in (0, 1))
    e["wall"] += e["downtime"]
    stall = of(found1, "stalled")[0]["seconds"]
    # Both ranks lose the stall (rank 0 waits for rank 1); each killed rank lost its last
    # step to the kill.
    e["stall"] = 2 * stall + sum(killed_at - last1[r]["wall"] for r in (0, 1))
    e["unattributed"] = sum(closed[r] - of(found2, "step", rank=r)[-1]["wall"] for r in (0, 1))
    resumed2 = of(found2, "resumed", rank=0)[0]["step"]
    assert resumed2 == 150
    for rank in (0, 1):
        rolled = next(iter(one[rank]["rolled"].values()))
        assert rolled["restored"] == 50
        # the steps the rollback threw away: 51..the step it was applied at, first run
        thrown = []
        for step, seconds in one[rank]["productive"]:
            if rolled["restored"] < step <= rolled["step"]:
                thrown.append((step, seconds))
            if step == rolled["step"]:
                break
        e["discarded_rollback"] += sum(s for _, s in thrown)
        # the steps the restart threw away: after 150 in the killed run, up to its last
        e["discarded_restart"] += sum(s for step, s in one[rank]["productive"]
                                      if step > resumed2)
    assert two  # the second launch's steps counted above
    e["productive"] = e["wall"] - sum(e[c] for c in gp.CAUSES)

    # --- compare ------------------------------------------------------------------------------
    report = {k: (round(totals.get(k, 0.0), 2), round(v, 2)) for k, v in e.items()}
    print("goodput (exporter, measured):", report)
    for key, want in e.items():
        got = totals.get(key, 0.0)
        assert abs(got - want) <= max(0.05 * want, 1.0), (key, report)
    parts = sum(totals[k] for k in gp.KINDS)
    assert abs(parts - totals["wall"]) <= 0.01 * totals["wall"], report
    goodput = totals["productive"] - totals["discarded_rollback"] - totals["discarded_restart"]
    assert 0 < goodput < totals["productive"], report
    # the job restart continued the counters: nothing went backwards
    assert all(totals[k] >= before_relaunch[k] for k in before_relaunch), report
    assert stall >= STALL_SECONDS - 0.5
