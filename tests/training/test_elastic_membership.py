"""Issue 13, acceptance 3: restarts and world-size changes replace the job's rank set.

Real torchrun jobs of the test worker (gloo) against a real exporter. Old code kept departed
ranks, so world size stayed 4 and every later command stayed "partial".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.net import free_port, wait_until
from tests.support.procs import ManagedProcess, running
from tests.training.support import JOB_BASE_ENV, Exporter, elastic_torchrun, events, exporter, of
from tests.training.test_job_identity import WORKER, kill_whole, unnamed_env, worker_torchrun
from trainwatch.exporters.contract import catalog


def starts(proc: ManagedProcess, restarts: int) -> list[dict]:
    return of(events(proc), "start", restarts=restarts)


def post_and_wait_applied(exp: Exporter, job: str, command_id: str) -> dict:
    posted = exp.api("POST", f"/v1/jobs/{job}/commands", json={"id": command_id, "type": "mark"})
    assert posted.status_code == 202, posted.text
    return wait_until(lambda: (lambda d: d if d["status"] == "applied" else None)(
        exp.api("GET", f"/v1/jobs/{job}/commands/{command_id}").json()),
        timeout=60, what=f"{command_id} applied")


@pytest.mark.slow
def test_restarted_job_keeps_its_id_and_only_its_new_ranks(tmp_path: Path) -> None:
    with exporter(tmp_path) as exp:
        # In-place restarts need the c10d rendezvous with a store per round (ELASTIC_ENV,
        # tests/training/support.py): with the static one a restarted attempt can read the
        # dead attempt's gloo addresses and hang. Up to 3 restarts; the first that comes up
        # with both ranks is the one checked. No --rdzv-id: the job stays unnamed.
        argv = elastic_torchrun(WORKER, "--steps", "0", "--exit-rank", "1",
                                "--exit-at-step", "40", nproc=2, max_restarts=3)
        env = {**unnamed_env(exp), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        with running(argv, tmp_path / "job.log", env=env) as job:
            first = wait_until(lambda: starts(job, 0) if len(starts(job, 0)) == 2 else None,
                               timeout=90, what="first attempt started")

            def restarted() -> list[dict] | None:
                for attempt in (1, 2, 3):
                    found = starts(job, attempt)
                    if len(found) == 2 and not starts(job, attempt + 1):
                        return found
                return None

            second = wait_until(restarted, timeout=180, what="restarted attempt")
            restart_count = second[0]["restarts"]
            ids = {e["job"] for e in first + second}
            assert len(ids) == 1, "the restart keeps the job's identity"
            (name,) = ids
            assert len({e["incarnation"] for e in second}) == 1
            assert {e["incarnation"] for e in first}.isdisjoint(e["incarnation"] for e in second)

            def only_new_ranks() -> bool:
                listed = [j for j in exp.api("GET", "/v1/jobs").json()["jobs"]
                          if j["job"] == name]
                return bool(listed) and listed[0]["incarnation"] == second[0]["incarnation"] \
                    and {r["restarts"] for r in listed[0]["ranks"].values()} == {restart_count}

            wait_until(only_new_ranks, timeout=30, what="rank set replaced")
            assert set(exp.by_rank(catalog.TRAINING_RESTARTS, name).values()) == {restart_count}
            done = post_and_wait_applied(exp, name, "after-restart")
            assert set(done["ranks"]) == {"0", "1"}
            assert len(of(events(job), "applied", id="after-restart")) == 2


@pytest.mark.slow
def test_four_to_two_ranks_replaces_the_rank_set(tmp_path: Path) -> None:
    job_name = "elastic-4-2"
    with exporter(tmp_path) as exp:
        env = {**JOB_BASE_ENV, **exp.job_env(job_name)}
        with running(worker_torchrun("--steps", "0", nproc=4, master_port=free_port()),
                     tmp_path / "job4.log", env=env) as job4:
            wait_until(lambda: len(exp.by_rank(catalog.TRAINING_STEP, job_name)) == 4,
                       timeout=90, what="4 ranks reporting")
            post_and_wait_applied(exp, job_name, "with-four")
            kill_whole(job4)  # the elastic agent gives up the node: 4 ranks gone at once
        with running(worker_torchrun("--steps", "0", nproc=2, master_port=free_port()),
                     tmp_path / "job2.log", env=env) as job2:
            wait_until(lambda: set(exp.by_rank(catalog.TRAINING_WORLD_SIZE, job_name).items())
                       == {("0", 2.0), ("1", 2.0)}, timeout=90, what="2-rank set only")
            done = post_and_wait_applied(exp, job_name, "with-two")
            assert set(done["ranks"]) == {"0", "1"}
            assert len(of(events(job2), "applied", id="with-two")) == 2
            # the earlier command is judged against the current members too
            earlier = exp.api("GET", f"/v1/jobs/{job_name}/commands/with-four").json()
            assert earlier["status"] == "applied" and set(earlier["ranks"]) == {"0", "1"}
