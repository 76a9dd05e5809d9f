"""Every console script answers `--version` with the one version (exporters/__init__.py's
`__version__`, which pyproject.toml reads), and the distribution's name and the typed marker
are what pip sees."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib

import trainwatch.exporters

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = sorted(PYPROJECT["project"]["scripts"])


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_console_script_prints_the_version(script: str) -> None:
    path = Path(sys.executable).parent / script
    done = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == [script, trainwatch.exporters.__version__], done.stdout


def test_the_version_lives_in_one_place_and_pip_sees_it() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "exporters.__version__"}
    assert project["name"] == trainwatch.exporters.DISTRIBUTION
    assert metadata.version(trainwatch.exporters.DISTRIBUTION) == trainwatch.exporters.__version__


def test_both_packages_ship_py_typed() -> None:
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    for package in ("exporters", "remediation"):
        assert "py.typed" in data[f"trainwatch.{package}"]
        assert (REPO / package / "py.typed").is_file()
