"""Issue 28, point 7 and acceptance 2: every kind of hang is located, in a real 4-rank job.

Real parts: torchrun with 4 gloo ranks of the test worker, the training exporter, and a real
Prometheus scraping it every second with the demo rule profile, shared by every kind (one job
name each). Each kind must alert naming rank 2 and its node. The production profile's timing
(within 120 s of the last step) is checked by promtool
(alert_rules/tests/production/hang_location_test.yml and stall_test.yml); blocking before the
default group's all-reduce is tests/training/test_hang.py.

- stopped: rank 2 is SIGSTOPped (its heartbeat stops with it);
- killed: rank 2 SIGKILLs itself; its peers' all-reduce raises, they exit saying so, and
  torchrun tears the job down: TrainingJobVanished names the rank that stopped first;
- outside: the step's all-reduce runs on a second group; rank 2 blocks before it, so the
  default group's sequence numbers are equal on every rank (old code named all four);
- other: rank 2 enters an all-reduce on another group (with rank 3, which waits in the
  step's): also equal sequence numbers on the default group (old code named all four).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.support.net import free_port, wait_until
from tests.support.procs import prometheus, running
from tests.training.support import JOB_BASE_ENV, Exporter, events, exporter, of
from tests.training.test_hang import prometheus_config
from tests.training.test_job_identity import kill_whole, worker_torchrun
from trainwatch.exporters.contract import catalog

RANK = "2"
NODE = "node-a"  # the exporter's --node (tests.training.support.exporter)


@dataclass
class Stack:
    exp: Exporter
    prom: str
    workdir: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("hang-kinds")
    with exporter(workdir) as exp, \
            prometheus(workdir, prometheus_config(workdir, exp.url)) as prom:
        yield Stack(exp, prom, workdir)


def firing(prom: str, alertname: str, job: str) -> list[dict]:
    alerts = requests.get(f"{prom}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == alertname
            and a["state"] == "firing" and a["labels"].get("training_job") == job]


KINDS = {
    "stopped": ("TrainingStalled", ()),
    "killed": ("TrainingJobVanished", ("--kill-rank", RANK, "--kill-at-step", "30")),
    "outside": ("TrainingStalled", ("--side-group", "--hang-rank", RANK,
                                    "--hang-at-step", "30")),
    "other": ("TrainingStalled", ("--side-group", "--hang-rank", RANK, "--hang-at-step", "30",
                                  "--hang-in", "pair")),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_of_hang_names_the_rank_and_its_node(stack: Stack, kind: str) -> None:
    alertname, fault = KINDS[kind]
    job_name = f"hang-{kind}"
    env = {**JOB_BASE_ENV, **stack.exp.job_env(job_name), "TORCH_FR_BUFFER_SIZE": "200"}
    argv = worker_torchrun("--steps", "0", "--step-time", "0.05", *fault, nproc=4,
                           master_port=free_port())
    with running(argv, stack.workdir / f"{kind}.log", env=env) as job:
        try:
            if kind == "stopped":
                started = wait_until(lambda: of(events(job), "start", rank=int(RANK)),
                                     timeout=120, what="rank 2 started")[0]
                wait_until(lambda: stack.exp.by_rank(catalog.TRAINING_STEP, job_name)
                           .get(RANK, 0) >= 30, timeout=120, what="30 steps")
                os.kill(started["pid"], signal.SIGSTOP)
                last_step = time.time()
            else:
                event = "killing" if kind == "killed" else "hanging"
                last_step = wait_until(lambda: of(events(job), event), timeout=120,
                                       what=f"rank 2 {event}")[0]["time"]
            alerts = wait_until(lambda: firing(stack.prom, alertname, job_name), timeout=120,
                                what=f"{alertname} for {kind}")
            latency = time.time() - last_step
            print(f"{kind}: {alertname} (demo profile) firing {latency:.1f} s after the "
                  "last step")
            assert [(a["labels"].get("rank"), a["labels"].get("node")) for a in alerts] == [
                (RANK, NODE)], alerts
            if kind == "killed":  # the peers' last word did not change how they die
                wait_until(lambda: not job.alive(), timeout=60, what="torchrun ended")
                summary = job.log_text()
                assert "Signal 9 (SIGKILL) received by PID" in summary
                assert summary.count("Signal 15 (SIGTERM) received by PID") == 3, summary[-3000:]
        finally:
            kill_whole(job)  # SIGKILL reaches a stopped rank too
    if kind == "killed":  # the peers said they ended on an error; the killed rank did not
        assert stack.exp.by_rank(catalog.TRAINING_EXITED, job_name) == {
            "0": 1.0, "1": 1.0, "3": 1.0}
