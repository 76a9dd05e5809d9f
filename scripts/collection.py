"""Build and install the `trainwatch.stack` Ansible collection (the source is ansible/).

    python -m scripts.collection build [--out DIR]      # DIR/trainwatch-stack-<version>.tar.gz
    python -m scripts.collection install [--path DIR]   # build, then install into DIR
                                                        # (default .stack/collections)
    python -m scripts.collection stage DIR              # the tree the build packs, to lint it

The roles never read the repository: what the repository generates travels inside the
collection, copied in here at build time from its one source (GENERATED below), so an
installed collection is the deployment of the commit it was built from. The copies exist only
in the staged tree and the archive, never in ansible/. What is packed besides ansible/ (without
NOT_SHIPPED):

* GENERATED below: the contract, the Alertmanager template, the dashboards, the remediation
  playbooks, and every rule profile of alert_rules/generated/ (roles/prometheus/files/rules/);
* the project's own wheel (scripts/project_wheel.py, about 2 s), in WHEELS: the _common role
  installs the hosts' virtualenv from it by default (trainwatch_project_source: wheel), so an
  installed collection deploys with no checkout on the controller.

The version is trainwatch.exporters.__version__; ansible/galaxy.yml must carry the same one,
and the build refuses to pack a different one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from scripts import project_wheel
from trainwatch.exporters import __version__

OUTPUT_TAIL = project_wheel.OUTPUT_TAIL  # characters of a failed command's output shown

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "ansible"
NAMESPACE, NAME = "trainwatch", "stack"
DEFAULT_INSTALL_PATH = REPO / ".stack" / "collections"
# Not part of the collection: the repository's own inventories and test scenario.
NOT_SHIPPED = ("inventories", "molecule", ".ansible", "__pycache__", "*.pyc", "*.tar.gz")
RULES = REPO / "alert_rules" / "generated"
# (one source in the repository, its place in the collection); a folder source copies the
# files matching the pattern given after it.
GENERATED: tuple[tuple[Path, str, str], ...] = (
    (REPO / "exporters" / "contract", "contract.json", "plugins/lookup"),
    (REPO / "alert_rules", "alertmanager.yml.j2", "roles/alertmanager/templates"),
    (REPO / "dashboards" / "generated", "*.json", "roles/grafana/files/dashboards"),
    (SOURCE / "playbooks" / "remediation", "*.yml", "roles/remediation/files/playbooks"),
)
# Where the project's wheel goes in the collection: the _common role finds it there
# (fileglob wheels/*.whl in its files/, tasks/preflight.yml).
WHEELS = "roles/_common/files/wheels"


class BuildError(RuntimeError):
    """The collection cannot be built or installed; the message says what to fix."""


def _tool(name: str) -> str:
    """An Ansible command beside this interpreter (the project's virtualenv), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise BuildError(f"{name} not found: install ansible-core (scripts/setup.sh)")
    return found


def _run(argv: list[str]) -> str:
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(argv)} failed ({proc.returncode}):\n"
                         f"{proc.stdout[-OUTPUT_TAIL:]}{proc.stderr[-OUTPUT_TAIL:]}")
    return proc.stdout


def check_version() -> str:
    """ansible/galaxy.yml's version, which must be the package's __version__ (the one place)."""
    galaxy = yaml.safe_load((SOURCE / "galaxy.yml").read_text())
    if galaxy.get("version") != __version__:
        raise BuildError(f"ansible/galaxy.yml has version {galaxy.get('version')!r}, "
                         f"trainwatch.exporters.__version__ is {__version__!r}: "
                         "set galaxy.yml's to it")
    return __version__


def stage(dest: Path) -> Path:
    """Write the tree the build packs into `dest` (which must not exist): ansible/ without the
    repository's inventories and scenarios, plus the generated files and the project's wheel."""
    check_version()
    shutil.copytree(SOURCE, dest, ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    for folder, pattern, target in GENERATED:
        files = sorted(folder.glob(pattern))
        if not files:
            raise BuildError(f"nothing matches {folder.relative_to(REPO)}/{pattern}: "
                             "regenerate the repository's outputs first")
        (dest / target).mkdir(parents=True, exist_ok=True)
        for path in files:
            shutil.copy2(path, dest / target / path.name)
    # Every rule profile (alert_rules/generated/<profile>/*.yml; kubernetes/ holds objects,
    # not rule files) under the prometheus role, chosen by prometheus_rules_profile.
    profiles = sorted(p for p in RULES.iterdir() if p.is_dir() and any(p.glob("*.yml")))
    if not profiles:
        raise BuildError(f"no rule profiles in {RULES.relative_to(REPO)}: run the rule generator")
    for profile in profiles:
        target = dest / "roles" / "prometheus" / "files" / "rules" / profile.name
        target.mkdir(parents=True)
        for path in sorted(profile.glob("*.yml")):
            shutil.copy2(path, target / path.name)
    try:
        wheel = project_wheel.build(dest / WHEELS)
    except project_wheel.WheelError as exc:
        raise BuildError(f"the project's wheel: {exc}") from exc
    if f"-{__version__}-" not in wheel.name:
        raise BuildError(f"{wheel.name} is not version {__version__}")
    return dest


def build(out_dir: Path) -> Path:
    """Build the collection archive into `out_dir`; its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trainwatch-collection-") as tmp:
        staged = stage(Path(tmp) / "stack")
        _run([_tool("ansible-galaxy"), "collection", "build", str(staged),
              "--output-path", str(out_dir), "--force"])
    archive = out_dir / f"{NAMESPACE}-{NAME}-{__version__}.tar.gz"
    if not archive.is_file():
        raise BuildError(f"ansible-galaxy wrote no {archive}")
    return archive


def install(archive: Path, path: Path) -> Path:
    """Install a built archive into the collections folder `path` (replacing an installed
    copy of any version); the folder to put in ANSIBLE_COLLECTIONS_PATH."""
    path.mkdir(parents=True, exist_ok=True)
    _run([_tool("ansible-galaxy"), "collection", "install", "--offline", "--force",
          "-p", str(path), str(archive)])
    if not (path / "ansible_collections" / NAMESPACE / NAME / "MANIFEST.json").is_file():
        raise BuildError(f"{archive} did not install into {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build the collection archive")
    build_cmd.add_argument("--out", type=Path, default=REPO / "build" / "collection")
    install_cmd = sub.add_parser("install", help="build, then install the collection")
    install_cmd.add_argument("--path", type=Path, default=DEFAULT_INSTALL_PATH)
    stage_cmd = sub.add_parser("stage", help="write the tree the build packs")
    stage_cmd.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build(args.out.resolve()))
        elif args.command == "stage":
            print(stage(args.dest.resolve()))
        else:
            with tempfile.TemporaryDirectory(prefix="trainwatch-collection-") as tmp:
                path = install(build(Path(tmp)), args.path.resolve())
            print(f"installed {NAMESPACE}.{NAME} {__version__} into {path}\n"
                  f"use it with: export ANSIBLE_COLLECTIONS_PATH={path}")
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
