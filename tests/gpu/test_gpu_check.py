"""scripts/gpu_check.sh is for GPU hosts; here (no GPU, no nvidia-smi) it must say so and stop
with exit 2 before starting anything. Its real run is recorded in docs/gpu_exporter.md."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
