"""Run the real ansible-playbook against localhost and read its PLAY RECAP.

Tests call the same command the README gives; only the prefix and the ports are overridden
(extra-vars), so a test never collides with a demo stack or another test. The roles and
playbooks are those of the trainwatch.stack collection as users get it: built from ansible/
with `ansible-galaxy collection build` and installed into a temporary collections path, once
per test process (installed_collection; the `ansible_collection` fixture), which every run
here finds through ANSIBLE_COLLECTIONS_PATH.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from scripts import collection

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
VENV_BIN = Path(sys.executable).parent
LOCAL_INVENTORY = ANSIBLE / "inventories" / "local"
# The collection's playbooks, by the names users run them with.
SITE = "trainwatch.stack.site"
STOP = "trainwatch.stack.stop"
RECAP_LINE = re.compile(r"^(?P<host>\S+)\s*:\s*(?P<counts>(?:\w+=\d+\s*)+)$")


@dataclass
class PlaybookRun:
    """Exit status, per-host PLAY RECAP counters and the full output of one run."""

    rc: int
    recap: dict[str, dict[str, int]]
    output: str

    def total(self, counter: str) -> int:
        return sum(host.get(counter, 0) for host in self.recap.values())

    def describe(self) -> str:
        return f"rc={self.rc} recap={self.recap}\n--- output tail ---\n{self.output[-6000:]}"


def parse_recap(output: str) -> dict[str, dict[str, int]]:
    """The counters of every host in the last PLAY RECAP block of `output`."""
    recap: dict[str, dict[str, int]] = {}
    lines = output.splitlines()
    try:
        start = max(i for i, line in enumerate(lines) if line.startswith("PLAY RECAP"))
    except ValueError:
        return recap
    for line in lines[start + 1:]:
        match = RECAP_LINE.match(line.strip())
        if match:
            counts = dict(pair.split("=") for pair in match["counts"].split())
            recap[match["host"]] = {k: int(v) for k, v in counts.items()}
    return recap


@functools.cache
def _scratch() -> Path:
    root = Path(tempfile.mkdtemp(prefix="trainwatch-collection-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


@functools.cache
def built_collection() -> Path:
    """The collection archive (trainwatch-stack-<version>.tar.gz), built once per test
    process into a temporary folder removed when the process exits."""
    return collection.build(_scratch() / "dist")


@functools.cache
def installed_collection() -> Path:
    """The built collection installed into a temporary collections path; that path, for
    ANSIBLE_COLLECTIONS_PATH."""
    return collection.install(built_collection(), _scratch() / "collections")


def ansible_env(collections_path: Path | None = None) -> dict[str, str]:
    """The environment of an Ansible command: this virtualenv's tools first, no colours, and
    the collection installed for the suite unless `collections_path` names another."""
    env = dict(os.environ)
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_STDOUT_CALLBACK": "default",
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_COLLECTIONS_PATH": str(collections_path or installed_collection()),
    })
    return env


def run_playbook(playbook: str | Path, extra_vars: dict, workdir: Path, *,
                 inventory: Path = LOCAL_INVENTORY, check: bool = False,
                 limit: str | None = None, timeout: float = 600,
                 env: dict[str, str] | None = None, cwd: Path = REPO) -> PlaybookRun:
    """ansible-playbook -i <inventory> <playbook> -e @<vars file> [--check], from `cwd`.

    `playbook` is a file (a test's own playbook) or a playbook of the collection by name
    (SITE, STOP); the roles come from the collection installed for the suite, unless `env`
    (an ansible_env() of another collections path) says otherwise.
    """
    path = Path(playbook)
    vars_file = workdir / f"extra-vars-{path.stem if path.suffix else path.name}.yml"
    vars_file.write_text(yaml.safe_dump(extra_vars))
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(playbook),
            "-e", f"@{vars_file}"]
    if check:
        argv.append("--check")
    if limit:
        argv += ["--limit", limit]
    proc = subprocess.run(argv, cwd=cwd, env=env or ansible_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    output = proc.stdout + proc.stderr
    return PlaybookRun(rc=proc.returncode, recap=parse_recap(output), output=output)
