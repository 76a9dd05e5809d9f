"""ansible-lint (production profile, offline) on the trainwatch.stack collection as it is built
(tests the build's staged tree, generated files included) and on the repository's own
playbooks, inventories and scenario; ansible-playbook --syntax-check for every playbook this
area ships, the collection's by the names users run them with."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scripts import collection
from tests.ansible.runner import ANSIBLE, LOCAL_INVENTORY, REPO, SITE, STOP, VENV_BIN, ansible_env

PLAYBOOKS = [SITE, STOP, str(REPO / "tests/ansible/render.yml"), str(REPO / "compose/render.yml")]
EXAMPLE = ANSIBLE / "inventories" / "example-cluster"
LOOPBACK = ANSIBLE / "inventories" / "loopback-cluster"
PASSED = "Profile 'production' was required, and it passed"


@pytest.mark.parametrize("inventory", [LOCAL_INVENTORY, EXAMPLE, LOOPBACK],
                         ids=["local", "example", "loopback"])
@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=lambda p: Path(p).name)
def test_syntax_check(playbook: str, inventory: Path, ansible_collection: Path) -> None:
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory),
                           playbook, "--syntax-check"], cwd=REPO, env=ansible_env(),
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def lint(cwd: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "ansible-lint"), "--offline", "--profile", "production",
                           "--nocolor", *targets],
                          cwd=cwd, env=ansible_env(), capture_output=True, text=True,
                          check=False, timeout=300)


def test_the_collection_passes_ansible_lint_production(tmp_path: Path) -> None:
    staged = collection.stage(tmp_path / "trainwatch.stack")
    proc = lint(staged)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert PASSED in proc.stdout + proc.stderr


def test_the_repositorys_playbooks_pass_ansible_lint_production(
        ansible_collection: Path) -> None:
    proc = lint(REPO, "tests/ansible/render.yml", "compose/render.yml", "ansible/inventories",
                "ansible/molecule")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert PASSED in proc.stdout + proc.stderr
