"""Job/rank attribution from /proc/<pid>/environ: untrusted input, validated and bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainwatch.exporters.contract import identity
from trainwatch.exporters.node.gpu.processes import (
    MAX_ENVIRON_BYTES,
    ProcessAttributor,
    job_and_rank,
    read_proc_environ,
)


def write_environ(root: Path, pid: int, data: bytes) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "environ").write_bytes(data)


@pytest.mark.parametrize(("env", "expected"), [
    ({"TRAINWATCH_JOB": "job-a", "RANK": "2"}, ("job-a", "2")),
    ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "4242", "SLURM_PROCID": "07"},
     ("4242", "7")),
    # an invalid explicit name is unattributed, not replaced by another variable's job (the
    # training client refuses such a name, so no training metrics carry either job)
    ({"TRAINWATCH_JOB": "bad job; rm -rf /", "SLURM_JOB_ID": "17"}, ("", "")),
    ({"TRAINWATCH_JOB": "x" * 500, "RANK": "-1"}, ("", "")),
    ({"RANK": "12345678"}, ("", "")),
    ({}, ("", "")),
    (None, ("", "")),
])
def test_job_and_rank_accepts_only_bounded_well_formed_values(env, expected) -> None:
    assert job_and_rank(env) == expected


TORCHRUN_NO_RDZV_ID = {
    "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500",
    "TORCHELASTIC_ERROR_FILE": "/tmp/torchelastic_ab12/none_x9/attempt_0/3/error.json",
    "RANK": "3",
}


@pytest.mark.parametrize("env", [
    TORCHRUN_NO_RDZV_ID,  # no job name at all: the id derived from the rendezvous
    {"PMIX_NAMESPACE": "prterun-h-12@1", "OMPI_COMM_WORLD_RANK": "1"},  # made label-safe
    {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0"},
    {"TRAINWATCH_JOB": "named", **TORCHRUN_NO_RDZV_ID},
])
def test_gpu_processes_name_the_job_the_training_client_names(env, tmp_path: Path) -> None:
    """One identity function (identity.job_from_env) for training metrics and GPU processes,
    also after the environment went through /proc/<pid>/environ."""
    expected = identity.job_from_env(env)
    assert expected
    assert job_and_rank(env)[0] == expected
    write_environ(tmp_path, 20, b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    assert job_and_rank(read_proc_environ(20, tmp_path))[0] == expected


def test_read_proc_environ_keeps_only_known_variables(tmp_path: Path) -> None:
    write_environ(tmp_path, 10, b"PATH=/bin\0TRAINWATCH_JOB=j1\0SECRET_TOKEN=abc\0RANK=1\0")
    assert read_proc_environ(10, tmp_path) == {"TRAINWATCH_JOB": "j1", "RANK": "1"}


def test_read_proc_environ_is_bounded_and_drops_a_cut_entry(tmp_path: Path) -> None:
    big = b"A=" + b"x" * MAX_ENVIRON_BYTES + b"\0RANK=5\0"
    write_environ(tmp_path, 11, b"TRAINWATCH_JOB=j2\0" + big)
    assert read_proc_environ(11, tmp_path) == {"TRAINWATCH_JOB": "j2"}


def test_unreadable_or_invalid_pid_is_unattributed(tmp_path: Path) -> None:
    assert read_proc_environ(12345, tmp_path) is None
    assert read_proc_environ(-1, tmp_path) is None


def test_attributor_caches_and_forgets_exited_pids() -> None:
    reads: list[int] = []

    def source(pid: int) -> dict[str, str]:
        reads.append(pid)
        return {"TRAINWATCH_JOB": f"job{pid}", "RANK": "0"}

    attributor = ProcessAttributor(source)
    assert attributor.attribute(5) == ("job5", "0")
    assert attributor.attribute(5) == ("job5", "0")
    assert reads == [5]
    attributor.retain([])
    attributor.attribute(5)
    assert reads == [5, 5]
