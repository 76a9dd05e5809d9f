"""Real multi-rank checkpoint jobs (torchrun, CPU, gloo, FSDP2-sharded models).

- A rank that cannot read the chosen checkpoint: every rank reports the rollback failed, no
  rank changes its state (weights, optimizer, RNG), and the job stays in step.
- Node-local checkpoint directories are refused at start on every rank, with a clear error.
- A checkpoint written by 4 ranks restores on 2 with the same full-model digest.
- kill -9 of a random rank at random moments during 20 asynchronous saves (FSDP2 and DDP,
  torchrun restarting the job in place): the manifest only ever names complete checkpoints,
  and every restart resumes from the newest complete healthy one, bit-identical.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.net import free_port, wait_until
from tests.support.procs import running
from tests.training.ckpt_worker import complete
from tests.training.support import (
    ELASTIC_ENV,
    JOB_BASE_ENV,
    REPO,
    elastic_torchrun,
    events,
    of,
)
from trainwatch.exporters.rank.checkpoint import CheckpointManager, weights_digest

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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


def newest_healthy(entries: list[dict]) -> str | None:
    healthy = [e for e in entries if e.get("healthy")]
    return max(healthy, key=lambda e: (e["step"], e.get("time", 0)))["dir"] if healthy else None


SAVES = 20
KILLS = 4  # at least: saves run on while a kill is under way, so 20 may take fewer


@pytest.mark.slow
@pytest.mark.parametrize("model", ["fsdp", "ddp"])
def test_kill_9_of_a_rank_during_async_saves_never_leaves_a_bad_manifest(
        tmp_path: Path, model: str) -> None:
    """One job saving asynchronously every step (every 4th save unhealthy: a NaN loss), a
    random rank killed with SIGKILL at a random moment (after a random number of saves, plus
    a random fraction of a save) until 20 saves were started; torchrun restarts the job in
    place from the same directory each time. At every start rank 0 checks the manifest it
    finds before any rank writes (every entry complete), and every rank resumes from the
    newest complete healthy checkpoint, bit-identical to the weights it was saved with."""
    directory = tmp_path / "ckpt"
    seed = int(os.environ.get("TRAINWATCH_TEST_SEED", random.randrange(1 << 30)))
    print(f"kill schedule seed: {seed} (TRAINWATCH_TEST_SEED={seed} repeats it)")
    chooser = random.Random(seed)
    saved: dict[tuple[str, int], str] = {}  # (run id, step) -> full-model digest when saved

    def digest(name: str) -> str:  # checkpoint directories are step-<step>-<run id>-<n>
        _, step, run, _ = name.split("-")
        return saved[(run, int(step))]

    def record(attempt: int) -> int:
        run = of(events(job), "resumed", attempt=attempt, rank=0)[0]["run"]
        found = of(events(job), "saving", attempt=attempt, rank=0)
        saved.update({(run, e["step"]): e["digest"] for e in found})
        return len(found)

    saves = kills = 0
    argv = elastic_torchrun(WORKER, "killable", str(directory), model, max_restarts=100)
    with running(argv, tmp_path / "job.log", env=ELASTIC_ENV) as job:
        attempt = 0
        while True:
            def started(attempt: int = attempt) -> list[dict] | None:
                assert job.alive(), job.log_text()[-3000:]
                found = of(events(job), "resumed", attempt=attempt)
                return found if len(found) == 2 else None

            resumed = wait_until(started, timeout=120, what=f"attempt {attempt} resumed")
            (check,) = of(events(job), "manifest", attempt=attempt)
            assert check["incomplete"] == [], check
            expected = newest_healthy(check["entries"])
            assert {r["dir"] for r in resumed} == {expected}, (resumed, check)
            if expected is not None:
                assert {r["digest"] for r in resumed} == {digest(expected)}
            if saves >= SAVES and kills >= KILLS:
                break
            planned = chooser.randint(2, 7)
            wait_until(lambda a=attempt, n=planned: len(of(events(job), "saving", attempt=a,
                                                            rank=0)) >= n,
                       timeout=120, what=f"{planned} saves in attempt {attempt}")
            time.sleep(chooser.uniform(0, 0.15))  # a random moment, not a synchronisation
            victim = chooser.randrange(2)
            os.kill(of(resumed, "resumed", rank=victim)[0]["pid"], signal.SIGKILL)
            kills += 1
            wait_until(lambda a=attempt + 1: of(events(job), "manifest", attempt=a), timeout=120,
                       what=f"torchrun restarted the job after kill {kills}")
            saves += record(attempt)
            attempt += 1
        # The last kill: the whole job at once (agent first, so nothing restarts; torchrun's
        # workers run in sessions of their own, so each one is killed by its pid).
        time.sleep(chooser.uniform(0, 0.15))
        job.kill9()
        for rank in resumed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank["pid"], signal.SIGKILL)
        wait_until(lambda: not any(_alive(r["pid"]) for r in resumed), timeout=30,
                   what="the last attempt's ranks are gone")
        record(attempt)
    entries = json.loads((directory / "manifest.json").read_text())["checkpoints"]
    assert entries and all(complete(directory, e) for e in entries), entries
    if model == "fsdp":  # the newest healthy one also restores on one process
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.ReLU(),
                                  torch.nn.Linear(512, 4))
        manager = CheckpointManager(directory, net, torch.optim.SGD(net.parameters(), lr=0.01))
        restored = manager.resume()
        assert restored is not None and restored.directory == newest_healthy(entries)
        assert weights_digest(net) == digest(restored.directory)
