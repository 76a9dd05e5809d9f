"""A requeued job's hold is lifted when it is set, not when squeue first shows it.

Slurm gives a requeued batch job a begin time about 121 s ahead (the job credential's
lifetime) the moment its requeue completes, but squeue shows the reason `BeginTime` only once a
scheduling pass has looked at the job: 27 s after the requeue in one benchmark run, long
enough in another that the adapter's watch ended and the job waited out the whole hold (132 s
from the fault to its next start). Here the scheduling pass's lag is made as long as the hold:
the real squeue runs behind a filter that prints `None` for the reason `BeginTime` (a
fake of the one thing that is timing, named as such); the job, the requeue and the hold are
real Slurm. The job must start again long before its hold would have ended.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from tests.slurm.cluster import SlurmCluster
from tests.support.net import wait_until
from trainwatch.remediation.config import SchedulerSettings
from trainwatch.remediation.schedulers.base import Job
from trainwatch.remediation.schedulers.slurm import SlurmScheduler

# Fake: the real squeue, with the reason BeginTime printed as None (no scheduling pass yet).
LAGGING_SQUEUE = """#!{python}
import re, subprocess, sys
proc = subprocess.run([{real!r}, *sys.argv[1:]], capture_output=True, text=True)
sys.stdout.write(re.sub(r"\\bBeginTime\\b", "None", proc.stdout))
sys.stderr.write(proc.stderr)
sys.exit(proc.returncode)
"""
# Well under the hold (about 121 s): a job that started by then had its hold lifted.
START_DEADLINE_SECONDS = 60.0


def _lagging_bin(directory: Path) -> Path:
    directory.mkdir()
    for tool in ("scontrol", "sinfo"):
        (directory / tool).symlink_to(shutil.which(tool))
    squeue = directory / "squeue"
    squeue.write_text(LAGGING_SQUEUE.format(python=sys.executable, real=shutil.which("squeue")))
    squeue.chmod(0o755)
    return directory


def test_a_requeued_ended_job_starts_again_before_squeue_shows_its_hold(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    script = tmp_path / "job.sh"
    # each start leaves a line; the first fails as a killed rank's job does, the next runs
    script.write_text(f"#!/bin/sh\necho start >> {starts}\n"
                      f"[ $(wc -l < {starts}) -ge 2 ] && exec sleep 300\nexit 1\n")
    script.chmod(0o755)
    submitted = slurm.run(["sbatch", "--parsable", "--requeue", "--nodes=1",
                           f"--output={tmp_path / 'job.out'}", str(script)])
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    scheduler = SlurmScheduler(SchedulerSettings(
        slurm_conf=slurm.conf, bin_dir=_lagging_bin(tmp_path / "bin"),
        command_timeout_seconds=20))

    def row() -> list[str]:
        out = slurm.run(["squeue", "-h", "--states=all", f"--jobs={job_id}", "-o", "%T|%N"])
        return out.stdout.strip().split("|")

    wait_until(lambda: row()[0] == "FAILED", timeout=60, what=f"job {job_id} failed")
    requeued_at = time.monotonic()
    result = scheduler.requeue_ended(Job(job_id, "failed", row()[1]))
    assert result["requeued"] is True, result
    wait_until(lambda: starts.exists() and len(starts.read_text().splitlines()) >= 2,
               timeout=START_DEADLINE_SECONDS - (time.monotonic() - requeued_at),
               what=f"job {job_id} started again (its hold lifted)\n{slurm.logs()}")
