"""A client-only install (`pip install trainwatch-gpu`, no extra) has every console script of
pyproject.toml, and each one either works or says in one line which extra it needs; the
framework callbacks are part of the installed client.

Fresh virtualenv, offline from the local package sources (as test_client_install.py), no torch:
a script needs nothing of the training side. Before: every script ended in a traceback
(`No module named 'requests'`), and the callbacks lived in examples/, which is not installed.
"""

from __future__ import annotations

import shutil
import subprocess
import venv
from pathlib import Path

import pytest
import tomllib

from tests.packaging.test_client_install import local_pip_sources, pip
from trainwatch.exporters import DISTRIBUTION

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])


def test_every_console_script_works_or_names_its_extra(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", ".stack", "build", "*.egg-info", "__pycache__", ".pytest_cache",
        "node_modules"))
    pip(python, "install", "-q", *local_pip_sources(), str(source))

    answers = {}
    for script in SCRIPTS:
        done = subprocess.run([str(env_dir / "bin" / script), "--help"], capture_output=True,
                              text=True, timeout=120, check=False, cwd=tmp_path,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
        answers[script] = (done.returncode, done.stdout, done.stderr)
    for script, (rc, out, err) in answers.items():
        assert "Traceback" not in out + err, (script, err[-2000:])
        if rc != 0:
            assert err.count("\n") == 1, (script, err)
            assert f"pip install '{DISTRIBUTION}[stack]'" in err and script in err, (script, err)
        else:
            assert "usage:" in out, (script, out)
    assert any(rc != 0 for rc, _, _ in answers.values()), "the servers need the stack extra"

    # The callbacks are installed with the client; without their framework they say which
    # extra brings it, in one line.
    for name, extra in (("HuggingFaceCallback", "hf"), ("LightningCallback", "lightning")):
        probe = subprocess.run(
            [str(python), "-c", f"from trainwatch.exporters.rank import {name}"],
            capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
        assert probe.returncode != 0
        last = probe.stderr.strip().splitlines()[-1]
        assert f"{name} needs" in last and f"[{extra}]" in last, probe.stderr[-2000:]
    module_files = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(all(u.find_spec(m) for m in "
         "('trainwatch.exporters.rank.hf_callback', "
         "'trainwatch.exporters.rank.lightning_callback')))"],
        capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path)
    assert module_files.stdout.strip() == "True"
