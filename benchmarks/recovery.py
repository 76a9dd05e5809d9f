"""Time from a lost GPU to training again, by phase (issue 23, acceptance 5).

    .venv/bin/python benchmarks/recovery.py [--runs 1]

On the Slurm test cluster of tests/slurm (munged, slurmctld, three `slurmd -N` nodes on this
machine) a 2-node job (sbatch; srun starts torchrun per node, c10d rendezvous, gloo,
examples/train_ddp.py with a checkpoint every 5 steps) runs until two checkpoints are
committed; then the alerts of a lost GPU (GpuXidErrors XID 79 and GpuLost, each delivered
twice to each of two remediation replicas, as two Alertmanagers deliver) reach the webhook.
Measured, per run, from the webhook delivery:

  webhook -> drained and requeued      the acting intent's audit record (drain + requeue done)
  -> first heartbeat of the new incarnation   the job script's first line on its restart
  -> checkpoint restored               the last rank's `resumed` event
  -> first step                        the first step event after the restore

The alert path before the webhook is not measured here (no fake-NVML exporter and rule stack
in this run); it is computed from the configuration it depends on, for the production
profile: a fault is scraped within one scrape interval, the rule sees it within one
evaluation interval, it must hold for the alert's `for:`, and Alertmanager waits `group_wait`
before the first notification. Production total = that worst case + the measured phases
(restart and restore on a real job take longer with a large checkpoint: the figure says
which part is measured here). Goal: production profile <= 5 minutes from fault to training.
The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.remediation.helpers import alert  # noqa: E402
from tests.slurm.cluster import SlurmCluster, start  # noqa: E402
from tests.slurm.fixtures import drains, quarantine_book, requeues  # noqa: E402
from tests.slurm.test_heal_e2e import events, job_script, of  # noqa: E402
from tests.slurm.test_quarantine import NODE_HOST, deliver, running_on, services  # noqa: E402
from tests.support.net import free_port, wait_until  # noqa: E402

GOAL_SECONDS = 300.0
ALERTS = ("GpuXidErrors", "GpuLost")


def _seconds(value: str) -> float:
    from trainwatch.remediation.durations import seconds

    return seconds(value)


def production_alert_path() -> dict[str, Any]:
    """Worst case from fault to the webhook in the production profile, from its sources."""
    rules = yaml.safe_load((REPO / "alert_rules" / "config.yml").read_text())
    prom = yaml.safe_load((REPO / "ansible/roles/prometheus/defaults/main.yml").read_text())
    am = yaml.safe_load((REPO / "ansible/roles/alertmanager/defaults/main.yml").read_text())
    fors = {name: _seconds(rules["defaults"]["alerts"][name]["for"]) for name in ALERTS}
    parts = {"scrape_interval": _seconds(prom["prometheus_scrape_interval"]),
             "evaluation_interval": _seconds(prom["prometheus_evaluation_interval"]),
             "for": min(fors.values()),  # the first of the two alerts to fire acts
             "group_wait": _seconds(am["alertmanager_group_wait"])}
    return {"parts": parts, "for_by_alert": fors, "worst_case": sum(parts.values())}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def one_run(cluster: SlurmCluster, work: Path) -> dict[str, float]:
    out, ckpt = work / "job.out", work / "ckpt"
    script = work / "job.sh"
    script.write_text(job_script(out, ckpt, free_port()))
    submitted = cluster.run(["sbatch", "--parsable", f"--chdir={work}", str(script)])
    if submitted.returncode != 0:
        raise RuntimeError(submitted.stderr)
    job = submitted.stdout.strip().split(";")[0]
    try:
        bad = running_on(cluster, job)[0]
        wait_until(lambda: len({e["step"] for e in of(events(out), "checkpoint_saved")}) >= 2,
                   timeout=300, interval=0.2, what="two committed checkpoints")
        host = NODE_HOST[bad]
        alerts = [alert("GpuXidErrors", {"node": host, "gpu": "0", "xid": "79"}),
                  alert("GpuLost", {"node": host, "gpu": "0"})]
        with services(work / "svc", cluster, [quarantine_book()], replicas=2,
                      min_healthy_fraction=0.5) as (svcs, log, _):
            t_webhook = time.time()
            for item in alerts:
                for _ in range(2):
                    for svc in svcs:
                        deliver(svc, item)
            for svc in svcs:
                svc.wait_idle(120)
            if len(drains(log)) != 1 or len(requeues(log)) != 1:
                raise RuntimeError(f"expected one drain and one requeue: {drains(log)} "
                                   f"{requeues(log)}")
            [acted] = svcs[0].audit("acted")
        incarnation = wait_until(lambda: of(events(out), "incarnation", restart_count=1),
                                 timeout=300, interval=0.1, what="the new incarnation")[0]
        resumed = wait_until(lambda: (lambda r: r if len(r) == 2 else None)(
            of(events(out), "resumed")), timeout=300, interval=0.1, what="both ranks resumed")
        t_restored = max(r["time"] for r in resumed)
        first = wait_until(lambda: sorted(e["time"] for e in of(events(out), "step")
                                          if e["time"] > t_restored), timeout=300,
                           interval=0.1, what="a step after the restore")[0]
    finally:
        cluster.run(["scancel", job])
        wait_until(lambda: cluster.run(["squeue", "--noheader", f"--jobs={job}"]).stdout
                   .strip() == "", timeout=120, what="job gone")
        cluster.reset_nodes()
    return {"webhook_to_drained_requeued": acted["at"] - t_webhook,
            "requeued_to_new_incarnation": incarnation["time"] - acted["at"],
            "incarnation_to_checkpoint_restored": t_restored - incarnation["time"],
            "restored_to_first_step": first - t_restored,
            "webhook_to_first_step": first - t_webhook}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="tw-recovery-") as tmp:
        cluster = start(Path(tmp) / "slurm")
        try:
            for index in range(args.runs):
                work = Path(tmp) / f"run{index}"
                work.mkdir()
                runs.append(one_run(cluster, work))
                print(json.dumps({"run": index, **{k: round(v, 3) for k, v in
                                                   runs[-1].items()}}))
        finally:
            cluster.stop()
    measured = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    path = production_alert_path()
    production = path["worst_case"] + measured["webhook_to_first_step"]
    result = {
        "benchmark": "recovery", "runs": args.runs,
        "cpu": _cpu_model(), "load_average_1m": round(os.getloadavg()[0], 2),
        "measured_median_seconds": {k: round(v, 3) for k, v in measured.items()},
        "production_alert_path_seconds": path,
        "production_fault_to_first_step_seconds": round(production, 1),
        "goal_seconds": GOAL_SECONDS, "goal_met": production <= GOAL_SECONDS,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
