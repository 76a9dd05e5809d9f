"""One import namespace: the distribution installs `trainwatch` and nothing else at the top.

`exporters` and `remediation` are other published distributions' import names (Hugging Face's
`exporters` is common in training images). When Trainwatch installed packages by those names,
installing the published `remediation` overwrote Trainwatch's files and uninstalling it deleted
them. Now the product's folders are installed as `trainwatch.exporters` and
`trainwatch.remediation` (pyproject's package-dir), and the namesakes live beside them.
The namesakes come from .venv/namesakes (scripts/setup.sh downloads them), so the test runs
offline.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NAMESAKES = REPO / ".venv" / "namesakes"
INSTALLED = {"exporters": "trainwatch.exporters", "remediation": "trainwatch.remediation"}


def test_the_package_list_is_the_tree() -> None:
    """pyproject lists packages by hand (find cannot add the prefix): every folder with an
    __init__.py under the installed folders is listed, and nothing else."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {v: k for k, v in INSTALLED.items()}
    tree = sorted(
        ".".join([INSTALLED[init.relative_to(REPO).parts[0]],
                  *init.relative_to(REPO).parts[1:-1]])
        for folder in INSTALLED for init in (REPO / folder).rglob("__init__.py"))
    assert sorted(config["packages"]) == tree


def _pip(python: Path, *args: str) -> str:
    done = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _site_packages(python: Path) -> Path:
    return Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())


IMPORT_BOTH = ("import trainwatch.exporters as e, trainwatch.remediation as r; "
               "print(e.__file__); print(r.__file__); print(e.__version__)")


def test_the_wheel_installs_one_top_level_package_beside_its_namesakes(tmp_path: Path) -> None:
    assert (NAMESAKES / ".complete").is_file(), "run scripts/setup.sh --tests (it downloads them)"
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", ".stack", "build", "*.egg-info", "__pycache__", ".pytest_cache",
        "node_modules"))
    wheels = tmp_path / "wheels"
    _pip(Path(sys.executable), "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(source))
    (wheel,) = wheels.glob("trainwatch_gpu-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        top_level = next(n for n in archive.namelist() if n.endswith(".dist-info/top_level.txt"))
        assert archive.read(top_level).decode().split() == ["trainwatch"]
        assert {n.split("/")[0] for n in archive.namelist()
                if not n.split("/")[0].endswith(".dist-info")} == {"trainwatch"}

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = _site_packages(python)
    before = {p.name for p in site.iterdir()}
    _pip(python, "install", "-q", "--no-deps", str(wheel))
    added = {p.name for p in site.iterdir()} - before
    assert {name for name in added if not name.endswith(".dist-info")} == {"trainwatch"}
    ours = _digests(site / "trainwatch")
    assert "exporters/__init__.py" in ours and "remediation/engine.py" in ours

    def imports() -> list[str]:
        return subprocess.run([str(python), "-c", IMPORT_BOTH], capture_output=True, text=True,
                              cwd=tmp_path, check=True).stdout.split()

    expected = imports()
    assert all(path.startswith(str(site / "trainwatch")) for path in expected[:2])

    _pip(python, "install", "-q", "--no-deps", "--no-index", *map(str, sorted(
        NAMESAKES.glob("*.whl"))))
    assert {"exporters", "remediation"} <= {p.name for p in site.iterdir()}
    assert _digests(site / "trainwatch") == ours
    assert imports() == expected

    _pip(python, "uninstall", "-y", "-q", "exporters", "remediation")
    assert _digests(site / "trainwatch") == ours
    assert imports() == expected
