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


# --- console scripts ---------------------------------------------------------------------------
# Each console script starts here, not at its module: a client-only install
# (`pip install trainwatch-gpu`, no `[stack]`) has the scripts but not the servers' packages,
# and a script run there answers in one line which extra it needs instead of a traceback.
# A missing module of Trainwatch itself is a bug and still raises.

def _launch(module: str, extra: str = "stack") -> int:
    """Run `module`'s main(); without the extra its packages come from, one line naming it.
    The program's name is the script's own (pyproject.toml names each script once)."""
    import importlib
    import os
    import sys

    try:
        main = importlib.import_module(module).main
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "trainwatch":
            raise
        prog = os.path.basename(sys.argv[0])
        print(f"{prog}: needs the '{extra}' extra (no module {exc.name!r}): "
              f"pip install '{DISTRIBUTION}[{extra}]'", file=sys.stderr)
        return 1
    return int(main() or 0)


def training_exporter() -> int:
    return _launch("trainwatch.exporters.node.training.server")


def gpu_exporter() -> int:
    return _launch("trainwatch.exporters.node.gpu.cli")


def logscan() -> int:
    return _launch("trainwatch.exporters.node.logs.scanner_cli")


def remediation_server() -> int:
    return _launch("trainwatch.remediation.server")


def operator_cli() -> int:
    return _launch("trainwatch.remediation.operator")


def resume_node() -> int:
    return _launch("trainwatch.remediation.resume")
