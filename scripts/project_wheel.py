"""Build the project's wheel (the distribution pyproject.toml defines) for the collection to
carry, so that hosts install the services from what the collection brings instead of from a
checkout on the controller (issue 38).

    python -m scripts.project_wheel [--out DIR]     # DIR/trainwatch_gpu-<version>-py3-none-any.whl

The build runs in a temporary copy of the distribution's files (SOURCES), never in the
checkout: setuptools writes build/ and *.egg-info/ beside the sources it builds, and a stale
build/lib there would put deleted modules into the wheel. It uses this interpreter's pip and
setuptools with no build isolation and no index (nothing is downloaded; about 2 s). The same
tree gives the same bytes: the files' timestamps in the wheel are SOURCE_DATE_EPOCH, a fixed
date unless the caller's environment sets one, and setuptools writes the files sorted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What the distribution is built from: its definition, the readme its metadata embeds, and the
# two folders it installs as trainwatch.exporters and trainwatch.remediation.
SOURCES = ("pyproject.toml", "README.md", "exporters", "remediation")
NOT_BUILT = ("__pycache__", "*.pyc", "build", "*.egg-info")
# 1980-01-01T00:00:00Z, the earliest time a zip entry can carry.
FIXED_EPOCH = "315532800"
OUTPUT_TAIL = 4000  # characters of a failed command's output shown in an error (the builds)


class WheelError(RuntimeError):
    """The wheel cannot be built; the message says why."""


def build(out_dir: Path, root: Path = REPO) -> Path:
    """Build the wheel of the project at `root` into `out_dir`; its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trainwatch-wheel-") as tmp:
        src, dist = Path(tmp) / "src", Path(tmp) / "dist"
        src.mkdir()
        for name in SOURCES:
            path = root / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=shutil.ignore_patterns(*NOT_BUILT))
            else:
                shutil.copy2(path, src / name)
        env = {**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH",
                                                                  FIXED_EPOCH)}
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--no-index", "--disable-pip-version-check", "--quiet", "--wheel-dir", str(dist),
             str(src)],
            capture_output=True, text=True, check=False, env=env, cwd=tmp)
        wheels = sorted(dist.glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise WheelError(f"pip wheel failed ({proc.returncode}, wheels: "
                             f"{[w.name for w in wheels]}):\n{proc.stdout[-OUTPUT_TAIL:]}"
                             f"{proc.stderr[-OUTPUT_TAIL:]}")
        target = out_dir / wheels[0].name
        shutil.copyfile(wheels[0], target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "build" / "wheel")
    args = parser.parse_args(argv)
    try:
        print(build(args.out.resolve()))
    except WheelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
