"""The whole path for faults that end the job, with no alert posted by hand: a 2-node job under
sbatch (srun, torchrun per node, c10d, gloo) on the shared Slurm test cluster, one training
exporter and one GPU exporter (fake NVML, file-backed scenario) per node, Prometheus scraping
them with the shipped demo rules, Alertmanager with the rendered config, the remediation
service (a real process) with the shipped playbooks.

* a rank SIGKILLed: TrainingJobVanished names it, the ended job is requeued (found on the
  killed rank's node: its ranks name the job `heal-kill`, not by its Slurm id), no node
  drained, the job resumes from its newest committed checkpoint with equal weights;
* XID 48 on one node's GPU, taking the rank on it with it: GpuXidErrors, that node drained
  once, the ended job requeued and running on the healthy node and the spare, resumed as
  above;
* after that quarantine moved the job, its rank on the spare SIGKILLed: TrainingJobVanished
  names that rank (not the earlier launch's rank the drained node's exporter still serves),
  and the ended job is requeued.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.slurm.cluster import SlurmCluster
from tests.slurm.fixtures import drains, job_nodes, requeues
from tests.slurm.job_clock import RankClock, discarded_by_restart, productive_seconds
from tests.slurm.test_heal_e2e import events
from tests.slurm.test_heal_ended import assert_resumed
from tests.slurm.test_heal_hang import Stack, audit, monitoring, submit_job, wait_checkpoints
from tests.slurm.test_quarantine import NODE_HOST, running_on
from tests.support.net import free_port, wait_until
from tests.support.procs import running
from tests.training.goodput_support import (
    goodput_panels_sound,
    node_totals,
    settled_ettr,
)
from tests.training.support import of
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.node.gpu.fake_nvml import simulated_scenario
from trainwatch.exporters.node.tools.stack_dump import rank_processes

pytestmark = pytest.mark.slow


@contextmanager
def gpu_exporters(tmp_path: Path, nodes: tuple[str, ...], *,
                  extra_args: Mapping[str, Sequence[str]] | None = None
                  ) -> Iterator[tuple[dict[str, Path], dict[str, str]]]:
    """One GPU exporter per node on a fake NVML of its own (a scenario file: write an XID
    into it to raise one); yields (node -> scenario file, node -> exporter URL). `extra_args`
    (node -> arguments) are appended to that node's command line (e.g. the fast alerts'
    `--alertmanager-url URL --node HOST`)."""
    with ExitStack() as stack:
        scenarios: dict[str, Path] = {}
        urls: dict[str, str] = {}
        for node in nodes:
            scenario = tmp_path / f"nvml-{node}.json"
            scenario.write_text(json.dumps(simulated_scenario(1, dynamic=False)))
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            stack.enter_context(running(
                [str(Path(sys.executable).parent / "gpu-exporter"), "--bind", "127.0.0.1",
                 "--port", str(port), "--interval", "1", "--no-gpm",
                 *(extra_args or {}).get(node, ())],
                tmp_path / f"gpu-exporter-{node}.log", ready_url=f"{url}/metrics",
                env={"TRAINWATCH_FAKE_NVML": str(scenario)}))
            scenarios[node], urls[node] = scenario, url
        yield scenarios, urls


def kill_rank(job_name: str, node: str) -> float:
    """SIGKILL the rank of `job_name` on `node`; the time of the kill."""
    procs = wait_until(lambda: rank_processes(job_name, node), timeout=60,
                       what=f"the rank of {job_name} on {node}")
    os.kill(procs[0]["pid"], signal.SIGKILL)
    return time.time()


def test_killed_rank_through_prometheus_and_alertmanager_requeues_the_ended_job(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    job_name = "heal-kill"
    with monitoring(tmp_path, slurm, books=("job_restart",)) as stack:
        job, out, ckpt = submit_job(slurm, stack, tmp_path, job_name, ranks_per_node=1)
        first = running_on(slurm, job)
        wait_checkpoints(out)
        t_kill = kill_rank(job_name, first[1])
        acted = wait_until(lambda: audit(stack, "job_restart", "acted"), timeout=120,
                           what="the job's restart acted")
        t_acted = time.time()
        plan = acted[0]["detail"]["results"][0]["result"]["plan"]
        assert plan["alert"]["node"] == NODE_HOST[first[1]]
        assert (plan["fault"]["class"], plan["fault"]["action"]) == ("killed", "restart")
        assert requeues(stack.log) == [["requeue", job]] and drains(stack.log) == []
        assert_resumed(slurm, job, out, ckpt)
        print(f"SIGKILL -> restart acted {t_acted - t_kill:.1f} s (demo profile)")
    assert all("drain" not in slurm.node_state(n) for n in slurm.nodes)


def test_fatal_xid_that_kills_its_rank_drains_the_node_and_requeues_the_ended_job(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """Also issue 37, acceptance 2 and 3: the job moves off the drained node onto the spare;
    its wall, downtime and discarded seconds at the job level (every node's counters added
    up) equal the stopwatch within max(0.5 s, 2 %), and every Goodput dashboard query over
    the run is sound."""
    job_name = "heal-xid"
    clock = RankClock()
    with gpu_exporters(tmp_path, slurm.nodes) as (scenarios, urls), \
            monitoring(tmp_path, slurm, books=("node_quarantine",), gpus=urls) as stack:
        try:
            job, out, ckpt = submit_job(slurm, stack, tmp_path, job_name, ranks_per_node=1)
            first = running_on(slurm, job)
            slots1 = clock.incarnation(job_name, first, ranks=2)
            wait_checkpoints(out)
            bad = first[1]
            scenario = scenarios[bad]
            doc = json.loads(scenario.read_text())
            doc["xid_events"] = [{"gpu": 0, "xid": 48}]
            scenario.write_text(json.dumps(doc))
            killed = clock.pid(next(r for r, n in slots1.items() if n == bad))
            t_fault = kill_rank(job_name, bad)  # XID 48 takes the CUDA process with it
            clock.killed(killed, t_fault)
            acted = wait_until(lambda: audit(stack, "node_quarantine", "acted"), timeout=120,
                               what="the quarantine acted")
            t_acted = time.time()
            plan = acted[0]["detail"]["results"][0]["result"]["plan"]
            assert (plan["fault"]["xid"], plan["fault"]["nodes"]) == (48, [bad])
            assert len(drains(stack.log)) == 1 and requeues(stack.log) == [["requeue", job]]
            second = running_on(slurm, job, timeout=120)
            slots2 = clock.incarnation(job_name, second, ranks=2)
            assert bad not in second and set(first) - {bad} <= set(second)
            moved = [r for r in slots2 if slots2[r] != slots1[r]]
            assert moved, (slots1, slots2)  # a slot now runs on the spare
            resumed_from = job_level_goodput_is_the_stopwatch(stack, clock, out, job_name,
                                                              slots2)
            assert_resumed(slurm, job, out, ckpt)  # and cancelled
            hour_ettr_is_the_stopwatch(stack, clock, out, job_name, slots2, resumed_from)
            assert len(drains(stack.log)) == 1
            print(f"XID 48 + rank death -> quarantine acted {t_acted - t_fault:.1f} s (demo)")
        finally:
            clock.close()
    assert "drain" in slurm.node_state(bad)


def job_level_goodput_is_the_stopwatch(stack: Stack, clock: RankClock, out: Path, job: str,
                                       slots: dict[int, str]) -> int:
    """The job's counters on every node added up against the stopwatch, once each new node
    serves them (a new job's counters read zero for their first 30 s) and the job has
    stepped; then the Goodput dashboard over the whole run. The checkpoint resumed from."""
    resumed = wait_until(lambda: (r := of(events(out), "resumed")) and len(r) == 2 and r,
                         timeout=180, interval=0.5, what="both ranks resumed")
    resumed_from = resumed[0]["step"] - 1
    spare = [stack.exporters[n] for n in set(slots.values())]
    wait_until(lambda: all(node_totals(exp, job).get("wall", 0) > 0 for exp in spare),
               timeout=120, interval=0.5, what="the new nodes serving the job's counters")
    # Each slot's restart discard is booked with its new rank's first report, and it may be
    # zero (a kill right after a save): wait for a step no old rank reached on every node.
    found = events(out)
    restarted = of(found, "incarnation", restart_count=1)[0]["time"]
    beyond = max(e["step"] for e in of(found, "step") if e["time"] < restarted) + 1
    wait_until(lambda: all(served_step(stack.exporters[node], job, rank) >= beyond
                           for rank, node in slots.items()), timeout=60, interval=0.5,
               what=f"every new rank's step {beyond} served by its node")
    at = time.time()
    totals: dict[str, float] = {}
    for exp in stack.exporters.values():
        for key, value in node_totals(exp, job).items():
            totals[key] = totals.get(key, 0.0) + value
    found = events(out)
    old = [e for e in found if e.get("time", 0) < restarted]
    stopped = clock.stopped(found, 0)
    truth = {
        "wall": sum(at - clock.starts[0][r] for r in slots),
        "downtime": sum(clock.starts[1][r] - stopped[r] for r in slots),
        "discarded_restart": sum(discarded_by_restart(old, r, resumed_from) for r in slots),
    }
    report = {k: (round(totals.get(k, 0.0), 2), round(v, 2)) for k, v in truth.items()}
    print("job-level goodput (Trainwatch, stopwatch):", report)
    for key, want in truth.items():
        assert abs(totals.get(key, 0.0) - want) <= max(0.5, 0.02 * want), (key, report)
    points = goodput_panels_sound(stack.prom, job, clock.starts[0][0], time.time(), 2)
    assert points["Time by kind"] > 0 and points["ETTR (life)"] > 0, points
    return resumed_from


def served_step(exp: Any, job: str, rank: int) -> float:
    """The last step the node's exporter serves for the job's rank (-1: none)."""
    text = requests.get(exp.url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name == catalog.TRAINING_STEP
                    and sample.labels.get(catalog.LABEL_JOB) == job
                    and sample.labels.get(catalog.LABEL_RANK) == str(rank)):
                return sample.value
    return -1.0


def hour_ettr_is_the_stopwatch(stack: Stack, clock: RankClock, out: Path, job: str,
                               slots: dict[int, str], resumed_from: int) -> None:
    """After the job's end: the 1 h ETTR in Prometheus (the shipped rule) against the job's own
    step log (productive time kept, over each slot's first start to its last step)."""
    found = events(out)
    restarted = of(found, "incarnation", restart_count=1)[0]["time"]
    old = [e for e in found if e.get("time", 0) < restarted]
    new = [e for e in found if e.get("time", 0) >= restarted]
    kept = sum(productive_seconds(old, r) - discarded_by_restart(old, r, resumed_from)
               + productive_seconds(new, r) for r in slots)
    wall = sum(of(new, "step", rank=r)[-1]["time"] - clock.starts[0][r] for r in slots)
    ettr = settled_ettr(stack.prom, job, wall)
    print(f"1 h ETTR (Prometheus, stopwatch): {ettr:.4f}, {kept / wall:.4f}")
    assert abs(ettr - kept / wall) <= 0.01, (ettr, kept / wall)


def test_a_rank_killed_after_a_quarantine_moved_the_job_is_named_on_its_new_node(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """docs/performance.md, Chaos soak, bug 2: XID 48 moves the job off a node (drained,
    requeued onto the healthy node and the spare); then the rank on the spare is SIGKILLed,
    within TrainingJobVanished's memory of the first death. The drained node's exporter still
    serves the earlier launch's rank (its heartbeat the oldest), yet the alert names the
    killed rank on the spare, and job_restart requeues the ended job."""
    job_name = "heal-moved"
    with gpu_exporters(tmp_path, slurm.nodes) as (scenarios, urls), \
            monitoring(tmp_path, slurm, books=("node_quarantine", "job_restart"),
                       gpus=urls) as stack:
        job, out, _ = submit_job(slurm, stack, tmp_path, job_name, ranks_per_node=1)
        first = running_on(slurm, job)
        wait_checkpoints(out)
        bad = first[1]
        doc = json.loads(scenarios[bad].read_text())
        doc["xid_events"] = [{"gpu": 0, "xid": 48}]
        scenarios[bad].write_text(json.dumps(doc))
        kill_rank(job_name, bad)  # XID 48 takes the CUDA process with it
        wait_until(lambda: audit(stack, "node_quarantine", "acted"), timeout=120,
                   what="the quarantine acted")
        second = running_on(slurm, job, timeout=120)
        assert bad not in second and len(second) == 2
        [spare] = [node for node in second if node not in first]
        resumed = wait_until(lambda: (lambda r: r if len(r) == 2 else None)(
            of(events(out), "resumed")), timeout=180, interval=0.5, what="both ranks resumed")
        wait_until(lambda: sum(1 for e in of(events(out), "step")
                               if e["time"] > resumed[0]["time"]) >= 6, timeout=120,
                   interval=0.5, what="steps after the resume")
        before = len(requeues(stack.log))
        kill_rank(job_name, spare)
        wait_until(lambda: len(requeues(stack.log)) == before + 1, timeout=180,
                   what="the ended job requeued after the kill on the spare")
        restarted = wait_until(lambda: [a for a in audit(stack, "job_restart", "acted")
                                        if a["detail"]["results"][0]["result"]["requeued"]],
                               timeout=60, what="the restart that requeued it, audited")
        plan = max(restarted, key=lambda a: a["intent_id"])["detail"]["results"][0][
            "result"]["plan"]
        assert plan["alert"]["node"] == NODE_HOST[spare], plan["alert"]
        running_on(slurm, job, timeout=120)
        slurm.run(["scancel", job])
        wait_until(lambda: job_nodes(slurm, job)[0] == "", timeout=60, what="job gone")
