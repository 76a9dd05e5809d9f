"""Every part names a job the same way from the launcher's environment (exporters.catalog)."""

from __future__ import annotations

from exporters.gpu.processes import job_and_rank
from exporters.logs.identity import detect_job
from exporters.training.launcher import detect


def test_torchrun_placeholder_run_id_is_not_a_job_name_anywhere() -> None:
    env = {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "WORLD_SIZE": "2"}
    assert detect_job(env) == "default"
    assert detect(env=env).job == "default"
    assert job_and_rank(env) == ("", "1")
    env["SLURM_JOB_ID"] = "4242"
    assert detect_job(env) == detect(env=env).job == job_and_rank(env)[0] == "4242"
