"""Run the real ansible-playbook against localhost and read its PLAY RECAP.

Tests call the same command the README gives; only the prefix and the ports are overridden
(extra-vars), so a test never collides with a demo stack or another test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
VENV_BIN = Path(sys.executable).parent
LOCAL_INVENTORY = ANSIBLE / "inventories" / "local"
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


def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_STDOUT_CALLBACK": "default",
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles"),
    })
    return env


def run_playbook(playbook: str | Path, extra_vars: dict, workdir: Path, *,
                 inventory: Path = LOCAL_INVENTORY, check: bool = False,
                 limit: str | None = None, timeout: float = 600) -> PlaybookRun:
    """ansible-playbook -i <inventory> <playbook> -e @<vars file> [--check].

    A relative `playbook` is under ansible/; roles always come from ansible/roles.
    """
    path = ANSIBLE / playbook
    vars_file = workdir / f"extra-vars-{path.stem}.yml"
    vars_file.write_text(yaml.safe_dump(extra_vars))
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(path),
            "-e", f"@{vars_file}"]
    if check:
        argv.append("--check")
    if limit:
        argv += ["--limit", limit]
    proc = subprocess.run(argv, cwd=REPO, env=ansible_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    output = proc.stdout + proc.stderr
    return PlaybookRun(rc=proc.returncode, recap=parse_recap(output), output=output)
