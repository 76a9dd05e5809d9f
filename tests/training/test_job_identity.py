"""Issue 13, acceptance 4: unnamed jobs get ids that cannot collide, and commands stay apart.

Two real 2-rank torchrun jobs on this node, neither named (static rendezvous, so torchrun's
run id is its placeholder `none`), report to one real exporter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

from tests.support.net import free_port, wait_until
from tests.support.procs import ManagedProcess, running
from tests.training.support import JOB_BASE_ENV, Exporter, events, exporter, of
from trainwatch.exporters.contract import catalog, identity

WORKER = Path(__file__).with_name("jobs") / "worker.py"


def worker_torchrun(*args: str, nproc: int, master_port: int,
                    extra: tuple[str, ...] = ()) -> list[str]:
    """torchrun of the test worker on loopback; static rendezvous unless `extra` says else."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", str(master_port),
            *extra, str(WORKER), *args]


def unnamed_env(exp: Exporter) -> dict[str, str]:
    env = exp.job_env("unused")
    del env[catalog.ENV_JOB]
    return {**JOB_BASE_ENV, **env, catalog.ENV_JOB: ""}


def kill_whole(proc: ManagedProcess) -> None:
    """SIGKILL every rank and the agent: a job killed whole. torchrun starts each worker in a
    session of its own, so killing the agent's process group alone would orphan them."""
    for event in of(events(proc), "start"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(event["pid"], signal.SIGKILL)
    proc.kill9()


def start_ids(proc: ManagedProcess, count: int) -> set[str]:
    found = of(events(proc), "start")
    return {e["job"] for e in found} if len(found) >= count else set()


def test_job_ids_from_the_environment() -> None:
    torchrun = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none",
                "TORCHELASTIC_ERROR_FILE": "/tmp/torchelastic_ab/none_cd/attempt_0/1/error.json"}
    derived = identity.job_from_env(torchrun)
    assert derived is not None and derived.startswith(identity.DERIVED_JOB_PREFIX)
    # every rank and every restart of one launch derives the same id ...
    restarted = {**torchrun, "TORCHELASTIC_ERROR_FILE":
                 "/tmp/torchelastic_ab/none_cd/attempt_1/0/error.json"}
    assert identity.job_from_env(restarted) == derived
    # ... another launch (another agent directory or endpoint) another one
    other = {**torchrun, "TORCHELASTIC_ERROR_FILE":
             "/tmp/torchelastic_xy/none_zz/attempt_0/1/error.json"}
    assert identity.job_from_env(other) != derived
    # the c10d rendezvous gives each restart round a new MASTER_PORT: same launch, same id
    assert identity.job_from_env({**restarted, "MASTER_PORT": "29501"}) == derived
    # without the agent's directory the endpoint tells launches apart
    bare = {k: v for k, v in torchrun.items() if k != "TORCHELASTIC_ERROR_FILE"}
    assert identity.job_from_env(bare) != identity.job_from_env({**bare, "MASTER_PORT": "29501"})
    # launcher job ids win, made label-safe; an explicit name wins over everything
    assert identity.job_from_env({**torchrun, "TORCHELASTIC_RUN_ID": "run-7"}) == "run-7"
    assert identity.job_from_env({"PMIX_NAMESPACE": "prterun-h-12@1"}) == "prterun-h-12-1"
    assert identity.job_from_env({"OMPI_MCA_ess_base_jobid": "3298361345"}) == "3298361345"
    assert identity.job_from_env({**torchrun, catalog.ENV_JOB: "named"}) == "named"
    assert identity.job_from_env({}) is None


def test_two_unnamed_jobs_get_distinct_ids_and_a_command_reaches_only_one(
        tmp_path: Path) -> None:
    with exporter(tmp_path) as exp:
        env = unnamed_env(exp)
        with running(worker_torchrun("--steps", "0", nproc=2, master_port=free_port()),
                     tmp_path / "job-a.log", env=env) as job_a, \
                running(worker_torchrun("--steps", "0", nproc=2, master_port=free_port()),
                        tmp_path / "job-b.log", env=env) as job_b:
            ids_a = wait_until(lambda: start_ids(job_a, 2), timeout=90, what="job A started")
            ids_b = wait_until(lambda: start_ids(job_b, 2), timeout=90, what="job B started")
            assert len(ids_a) == len(ids_b) == 1, "every rank of a job names it alike"
            (a,), (b,) = ids_a, ids_b
            assert a != b and a.startswith("tw-") and b.startswith("tw-")
            wait_until(lambda: {a, b} <= {j["job"] for j in exp.api("GET", "/v1/jobs").json()
                                          ["jobs"]}, timeout=30, what="both jobs exported")
            wait_until(lambda: exp.api("POST", f"/v1/jobs/{a}/commands",
                                       json={"id": "only-a", "type": "mark"}).status_code == 202,
                       timeout=30, what="command type known")
            wait_until(lambda: exp.api("GET", f"/v1/jobs/{a}/commands/only-a").json()["status"]
                       == "applied", timeout=60, what="command applied by job A")
            assert len(of(events(job_a), "applied", id="only-a")) == 2
            assert of(events(job_b), "applied") == []
            assert exp.api("GET", f"/v1/jobs/{b}/commands").json()["commands"] == []
            assert exp.api("GET", f"/v1/jobs/{b}/commands/only-a").status_code == 404
