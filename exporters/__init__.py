"""Trainwatch's exporters and the training-side library (the client a rank imports).

`__version__` is the one place the version lives: pyproject.toml reads it (setuptools'
dynamic version) and every console script prints it with `--version`.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
# The distribution's name: `trainwatch` on the public package index is an unrelated project;
# this name was free there (checked with `pip index versions` and `pip download --no-deps`).
DISTRIBUTION = "trainwatch-gpu"


def add_version_argument(parser: Any) -> None:
    """`--version` on a console script's argparse parser: prints `<prog> <version>`."""
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {__version__} ({DISTRIBUTION})")
