"""Issue 28 point 4: after a scale-down, the departed node's exporter is a ghost that no
command waits on, and remediation targets only exporters that hold live ranks.

Real parts: two training exporters (node a keeps the job, node b's rank is SIGKILLed as its
node leaves), a real Prometheus scraping both, the remediation action itself. The live rank is
a TrainingMonitor stepping in a thread of this process; the departed one is another process.
Old code: node b answered "pending" until the job expired (600 s), so the action timed out
waiting on it; and the action sent to every exporter that still had the job's series.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest
import requests
import torch

from tests.support.net import wait_until
from tests.support.procs import prometheus, running
from tests.training.support import exporter, write_token
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank.client import TrainingMonitor
from trainwatch.remediation.actions import training_command
from trainwatch.remediation.actions.base import ActionContext
from trainwatch.remediation.actions.prometheus import job_instances
from trainwatch.remediation.config import Config

JOB = "scaled-down"
GHOST_RANK = """
import sys, time
from trainwatch.exporters.rank.client import TrainingMonitor
from trainwatch.exporters.contract.launcher import RankInfo
monitor = TrainingMonitor(rank_info=RankInfo(sys.argv[1], rank=1, local_rank=0, world_size=2,
                                             restarts=0),
                          socket_path=sys.argv[2], control=False, flush_interval=0.05)
monitor.report(0, loss=1.0)
print("reporting", flush=True)
time.sleep(3600)
"""


def scrape_config(path: Path, urls: list[str]) -> Path:
    path.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "training", "static_configs": [
            {"targets": [u.removeprefix("http://") for u in urls]}]}],
    }))
    return path


@pytest.mark.slow
def test_remediation_skips_the_departed_node_and_does_not_wait_on_it(tmp_path: Path) -> None:
    token = write_token(tmp_path)
    departed = ("--rank-departed-seconds", "2")
    with exporter(tmp_path, "a", node="node-a", token=token, extra=departed) as live, \
            exporter(tmp_path, "b", node="node-b", token=token, extra=departed) as ghost, \
            prometheus(tmp_path, scrape_config(tmp_path / "prom.yml",
                                               [live.url, ghost.url])) as prom:
        with running([sys.executable, "-c", GHOST_RANK, JOB, str(ghost.socket)],
                     tmp_path / "ghost.log") as ghost_rank:
            wait_until(lambda: ghost.by_rank(catalog.TRAINING_STEP, JOB) == {"1": 0.0},
                       timeout=60, what="node b's rank reporting")
            ghost_rank.kill9()  # node b leaves; torchrun goes on with node a's rank alone
        stop = threading.Event()
        optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
        survivor = RankInfo(JOB, rank=0, local_rank=0, world_size=1, restarts=1)
        monitor = TrainingMonitor(optimizer=optimizer, rank_info=survivor,
                                  socket_path=str(live.socket), sync_every=1, flush_interval=0.05,
                                  poll_interval=0.05)

        def train() -> None:
            step = 0
            while not stop.is_set():
                monitor.report(step, loss=0.5)
                step = monitor.step_end(step).next_step
                stop.wait(0.02)

        trainer = threading.Thread(target=train, daemon=True)
        trainer.start()
        try:
            config = Config(webhook_token="w" * 32, training_exporter_token=token[0],
                            store_path=tmp_path / "r.db", prometheus_url=prom,
                            alertmanager_url="http://127.0.0.1:9")
            ctx = ActionContext(config, {"training_job": JOB}, "key-1", requests.Session())
            def nodes() -> list[str]:
                return job_instances(ctx, JOB, action="training_command")

            wait_until(lambda: len(nodes()) == 2, timeout=60, what="both nodes seen by Prometheus")
            # Sent to both (the ghost still heartbeated seconds ago): node b's answer turns
            # "departed" and the action returns once node a's rank applied it.
            done = training_command.run({"action": "training_command", "command": "scale_lr",
                                         "args": {"factor": 0.5}, "timeout": "60s"}, ctx)
            a, b = (u.removeprefix("http://") for u in (live.url, ghost.url))
            assert done["ranks"][a] == {"0": {"status": "applied", "step": done["ranks"][a]
                                              ["0"]["step"]}}
            assert done["ranks"][b] == {"1": {"status": "departed"}}
            assert optimizer.param_groups[0]["lr"] == 0.5
            # Once its last heartbeat is older than RANK_DEPARTED_AFTER_SECONDS, the ghost is
            # no longer a target at all.
            wait_until(lambda: nodes() == [a],
                       timeout=catalog.RANK_DEPARTED_AFTER_SECONDS + 30,
                       what="only the live node targeted")
        finally:
            stop.set()
            trainer.join(10)
            monitor.close()
