"""The project installs the way the README says and its checkpoint manager works afterwards.

A fresh virtualenv without system site-packages, `pip install .` and `pip install
torch==2.13.0` (the local CPU wheel), nothing else: then a real checkpoint is saved and
restored. Before numpy was declared this crashed at the first save (the torch wheel does not
pull numpy in, and the manager turns RNG state into bytes through `.numpy()`). The script
changes the weights in place after an asynchronous save, so it calls `wait_staged()` first,
as docs/training.md asks of any change Trainwatch does not drive itself.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

SAVE_AND_RESTORE = """
import sys, torch
from trainwatch.exporters.rank.checkpoint import CheckpointManager, weights_digest
model = torch.nn.Linear(4, 2)
manager = CheckpointManager(sys.argv[1], model, torch.optim.SGD(model.parameters(), lr=0.1))
manager.save(1, loss=0.5)
digest = weights_digest(model)
manager.wait_staged()  # the contract: an own in-place change waits for the save's copy
with torch.no_grad():
    model.weight.add_(1.0)
assert manager.rollback().step == 1
assert weights_digest(model) == digest
print("ok")
"""


def test_pip_install_dot_plus_torch_saves_and_restores_a_checkpoint(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout.
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", ".stack", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    for argv in ([str(python), "-m", "pip", "install", "-q", "torch==2.13.0"],
                 [str(python), "-m", "pip", "install", "-q", str(source)]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    # Run outside the checkout so the installed package, not the source tree, is imported.
    done = subprocess.run([str(python), "-c", SAVE_AND_RESTORE, str(tmp_path / "ckpt")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
    assert sys.prefix not in done.stdout
