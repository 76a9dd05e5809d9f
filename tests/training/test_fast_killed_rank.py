"""Issue 35 point 3: a killed rank reaches the remediation webhook within seconds.

Real rank processes (the rank client, tests/training/jobs/lone_rank.py), the real training
exporter with fast alerts on, and a real Alertmanager with the production profile's
configuration (tests/support/fast_alerts.py). A rank SIGKILLed is posted as the rule's
TrainingJobVanished with its rank, node and job; a rank that ends on its own error, or
finishes, is not; of two ranks of one launch killed, only the first is (the second is a
consequence). Each negative case ends with a control rank killed afterwards: its alert
arriving alone shows the watch had judged the earlier ranks (no sleeping for an absence).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.fast_alerts import (
    DETECTION_BUDGET_SECONDS,
    FastStack,
    production_alertmanager,
)
from tests.support.net import wait_until
from tests.support.procs import ManagedProcess
from tests.training.support import Exporter, exporter
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract.catalog import LABEL_FAST

LONE_RANK = Path(__file__).with_name("jobs") / "lone_rank.py"
NODE = "gpu-node-07"
START_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FastStack, Exporter]]:
    """One Alertmanager and one exporter posting to it for the module (each test uses job
    names of its own: each job is an alert group of its own)."""
    tmp = tmp_path_factory.mktemp("fast-rank")
    with production_alertmanager(tmp) as am, \
            exporter(tmp, node=NODE, extra=("--alertmanager-url", am.url)) as exp:
        yield am, exp


@contextmanager
def ranks(tmp: Path, exp: Exporter, job: str, end: str, world: int = 1
          ) -> Iterator[list[ManagedProcess]]:
    """`world` ranks of one launch of `job`, reporting to the exporter; stopped at the end."""
    with ExitStack() as stack:
        procs = []
        for rank in range(world):
            proc = ManagedProcess(
                [sys.executable, str(LONE_RANK), "--end", end], tmp / f"{job}-{rank}.log",
                env={**exp.job_env(job), "RANK": str(rank), "LOCAL_RANK": str(rank),
                     "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": "29500", "PYTHONUNBUFFERED": "1"})
            stack.callback(proc.stop)
            procs.append(proc)
        wait_until(lambda: len(exp.by_rank(catalog.TRAINING_STEP, job)) == world,
                   timeout=START_TIMEOUT, what=f"every rank of {job} reporting")
        yield procs


def posts_for(am: FastStack, job: str) -> list[dict[str, Any]]:
    """The alerts the remediation webhook received for `job`."""
    return [alert for post in am.hooks.posts("/v1/alerts") for alert in post.body["alerts"]
            if alert["labels"].get("training_job") == job]


def kill_and_wait(am: FastStack, proc: ManagedProcess, job: str) -> dict[str, Any]:
    """SIGKILL the rank and return its fast alert, checked to arrive within the budget."""
    proc.kill9()
    killed = time.monotonic()
    [alert] = wait_until(lambda: posts_for(am, job), timeout=DETECTION_BUDGET_SECONDS * 3,
                         interval=0.05, what=f"the webhook notified of {job}")
    took = time.monotonic() - killed
    assert took <= DETECTION_BUDGET_SECONDS, f"{took:.1f}s from the kill to the webhook"
    return alert


def test_a_killed_rank_reaches_the_webhook_in_seconds(
        stack: tuple[FastStack, Exporter], tmp_path: Path) -> None:
    am, exp = stack
    with ranks(tmp_path, exp, "slurm-4711", "run") as [rank0]:
        alert = kill_and_wait(am, rank0, "slurm-4711")
    assert {k: alert["labels"].get(k) for k in (
        "alertname", "training_job", "rank", "node", "severity", "component", LABEL_FAST)} == {
        "alertname": "TrainingJobVanished", "training_job": "slurm-4711", "rank": "0",
        "node": NODE, "severity": "critical", "component": "training", LABEL_FAST: "true"}
    assert "rank 0" in alert["annotations"]["summary"]
    assert not [p for p in am.teams.posts() if p.body.get("alerts") and any(
        a["labels"].get("training_job") == "slurm-4711" for a in p.body["alerts"])], \
        "the fast copy pages nobody"
    sent = exp.samples(catalog.TRAINING_EXPORTER_FAST_ALERTS)
    assert sent[(("outcome", "sent"),)] >= 1


@pytest.mark.parametrize("end", ["raise", "finish"])
def test_a_rank_that_ends_on_its_own_is_not_posted(
        stack: tuple[FastStack, Exporter], tmp_path: Path, end: str) -> None:
    am, exp = stack
    job = f"ends-{end}"
    with ranks(tmp_path, exp, job, end) as [rank0]:
        wait_until(lambda: not rank0.alive(), timeout=START_TIMEOUT, what=f"the rank's {end}")
        assert (rank0.proc.returncode == 0) == (end == "finish"), rank0.log_text()[-2000:]
    control = f"control-{end}"
    with ranks(tmp_path, exp, control, "run") as [control0]:
        kill_and_wait(am, control0, control)
    assert posts_for(am, job) == [], f"a rank that ended by {end} is not a killed rank"


def test_of_two_ranks_killed_only_the_first_is_posted(
        stack: tuple[FastStack, Exporter], tmp_path: Path) -> None:
    am, exp = stack
    with ranks(tmp_path, exp, "pair", "run", world=2) as [rank0, rank1]:
        rank1.kill9()  # the first, then the consequence a moment later
        wait_until(lambda: posts_for(am, "pair"), timeout=DETECTION_BUDGET_SECONDS * 3,
                   interval=0.05, what="the first killed rank posted")
        rank0.kill9()
    with ranks(tmp_path, exp, "control-pair", "run") as [control0]:
        kill_and_wait(am, control0, "control-pair")
    [alert] = posts_for(am, "pair")
    assert alert["labels"]["rank"] == "1"
