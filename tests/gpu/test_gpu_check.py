"""scripts/gpu_check.sh is for GPU hosts; here (no GPU, no nvidia-smi) it must say so and stop
with exit 2 before starting anything, and its `--simulate` mode runs the same plumbing end to
end: real exporters, a real 2-rank torchrun job on CPU/gloo, and the fake NVML (named so:
there is no GPU here) given the job's real rank pids. Its real run is recorded in
docs/gpu_exporter.md."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU host: run it for real")
def test_gpu_check_refuses_a_host_without_a_gpu() -> None:
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--steps", "5"],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "not a GPU host" in result.stderr


def test_example_picks_the_cpu_here_and_refuses_cuda_without_it() -> None:
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import train_ddp
    finally:
        sys.path.remove(str(REPO / "examples"))
    assert str(train_ddp.pick_device("auto")) == "cpu"
    assert str(train_ddp.pick_device("cpu")) == "cpu"
    with pytest.raises(SystemExit, match="CUDA is not available"):
        train_ddp.pick_device("cuda")


@pytest.mark.slow
def test_gpu_check_plumbing_end_to_end_with_the_fake_nvml() -> None:
    # A short temporary root of its own: the training exporter's UNIX socket lies under it,
    # and pytest's own (longer under xdist) could pass the 108-byte limit.
    with tempfile.TemporaryDirectory(prefix="twgc", dir="/tmp") as short_tmp:
        result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--simulate",
                                 "--steps", "150", "--json"],
                                capture_output=True, text=True, timeout=600,
                                env={**os.environ, "PYTHON": sys.executable,
                                     "TMPDIR": short_tmp})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["checks"] == {
        "gpu_exporter_up": True, "training_exporter_up": True, "process_attribution": True,
        "gpm": True, "mfu_series": True, "ddp_job_finished": True}
    assert summary["attributed_ranks"] == ["0", "1"]
    assert summary["achieved_flops_per_second_rank0"] > 0


def test_an_exporter_that_cannot_start_ends_the_check_with_its_summary(tmp_path: Path) -> None:
    """A temporary folder too long for the training exporter's UNIX socket (108 bytes) makes
    that exporter exit at start. The check once went on waiting for it, then died on a
    refused connection with a traceback and no summary; it must report the failed check."""
    long_tmp = tmp_path / ("x" * 90)
    long_tmp.mkdir()
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--simulate",
                             "--steps", "50"],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHON": sys.executable,
                                 "TMPDIR": str(long_tmp)})
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "FAIL  training_exporter_up" in result.stdout
    assert "training exporter: its process exited with code 1" in result.stderr
    assert "Traceback" not in result.stderr
