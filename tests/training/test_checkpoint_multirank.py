"""Real multi-rank checkpoint jobs (torchrun, CPU, gloo, FSDP2-sharded models).

- A rank that cannot read the chosen checkpoint: every rank reports the rollback failed, no
  rank changes its state (weights, optimizer, RNG), and the job stays in step.
- Node-local checkpoint directories are refused at start on every rank, with a clear error.
- A checkpoint written by 4 ranks restores on 2 with the same full-model digest.
- kill -9 of a rank while asynchronous saves are in flight: the manifest only ever names
  complete checkpoints, and the newest one restores to the weights it was saved with.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from pathlib import Path

import pytest
import torch

from exporters.training.checkpoint import COMMITTED, CheckpointManager, weights_digest
from tests.support.net import free_port, wait_until
from tests.support.procs import running
from tests.training.support import JOB_BASE_ENV, REPO, events, of

WORKER = REPO / "tests" / "training" / "ckpt_worker.py"


def launch(scenario: str, directory: Path, nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            str(WORKER), scenario, str(directory)]


def run_to_end(scenario: str, directory: Path, nproc: int, log: Path) -> list[dict]:
    with running(launch(scenario, directory, nproc), log, env=JOB_BASE_ENV) as job:
        wait_until(lambda: not job.alive(), timeout=180, what=f"{scenario} job finished")
        assert job.proc.returncode == 0, job.log_text()[-3000:]
        return events(job)


def test_a_rank_that_cannot_read_fails_the_rollback_everywhere_and_nothing_changes(
        tmp_path: Path) -> None:
    results = of(run_to_end("unreadable", tmp_path / "ckpt", 2, tmp_path / "job.log"), "result")
    assert len(results) == 2
    for result in results:
        assert result["outcome"].startswith("failed: "), result
        assert "no rank changed its state" in result["outcome"]
        assert result["unchanged"] is True
        assert result["steps_sum"] == 6  # both ranks ran the next step's collectives
    assert "rng-rank1.json" in of(results, "result", rank=1)[0]["outcome"]


def test_node_local_directories_are_refused_at_start(tmp_path: Path) -> None:
    results = of(run_to_end("node_local", tmp_path, 2, tmp_path / "job.log"), "result")
    assert {r["outcome"] for r in results} == {"refused"} and len(results) == 2
    assert all("not shared by all 2 ranks" in r["error"] and "node-local" in r["error"]
               for r in results)


@pytest.mark.slow
def test_four_rank_checkpoint_restores_on_two_ranks(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    saved = of(run_to_end("save", directory, 4, tmp_path / "save.log"), "saved")
    loaded = of(run_to_end("load", directory, 2, tmp_path / "load.log"), "loaded")
    assert len(saved) == 4 and len(loaded) == 2
    assert len({s["digest"] for s in saved}) == 1
    assert {(x["step"], x["digest"]) for x in loaded} == {(1, saved[0]["digest"])}


def _complete(directory: Path, entry: dict) -> bool:
    path = directory / entry["dir"]
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    ranks = int(entry["world_size"])
    return ({COMMITTED, ".metadata", "job.json"} <= names
            and all(f"rng-rank{r}.json" in names for r in range(ranks)))


@pytest.mark.slow
def test_kill_9_of_a_rank_during_async_saves_never_leaves_a_bad_manifest(
        tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    chooser = random.Random(12)
    digests: dict[int, str] = {}
    for attempt in range(4):
        with running(launch("forever", directory, 2), tmp_path / f"job{attempt}.log",
                     env=JOB_BASE_ENV) as job:
            pids = wait_until(lambda: (p := {e["rank"]: e["pid"] for e in of(events(job), "pid")})
                              and len(p) == 2 and p, timeout=120, what="ranks started")
            target = chooser.randrange(2)
            wait_until(lambda: len(of(events(job), "saving")) >= 2 * chooser.randint(2, 6),
                       timeout=120, what="asynchronous saves under way")
            os.kill(pids[target], signal.SIGKILL)
            wait_until(lambda: not job.alive(), timeout=60, what="torchrun gives up")
            for event in of(events(job), "saving", rank=0):
                digests[event["step"]] = event["digest"]
        entries = json.loads((directory / "manifest.json").read_text())["checkpoints"]
        assert entries, "at least one checkpoint was committed before the kill"
        assert all(_complete(directory, e) for e in entries), entries
    # The newest committed checkpoint restores (here on one process: another world size).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 4))
    manager = CheckpointManager(directory, model, torch.optim.SGD(model.parameters(), lr=0.01))
    restored = manager.resume()
    assert restored is not None
    assert restored.step == manager.manifest()[-1]["step"]
    assert weights_digest(model) == digests[restored.step]
