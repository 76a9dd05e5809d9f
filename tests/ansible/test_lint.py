"""ansible-lint (production profile, offline: only ansible.builtin is used) and
ansible-playbook --syntax-check for every playbook this area ships."""

from __future__ import annotations

import subprocess

import pytest

from tests.ansible.runner import ANSIBLE, LOCAL_INVENTORY, REPO, VENV_BIN, ansible_env

PLAYBOOKS = [ANSIBLE / "deploy.yml", ANSIBLE / "stop.yml", REPO / "tests/ansible/render.yml",
             REPO / "compose/render.yml"]
EXAMPLE = ANSIBLE / "inventories" / "example-cluster"
LOOPBACK = ANSIBLE / "inventories" / "loopback-cluster"


@pytest.mark.parametrize("inventory", [LOCAL_INVENTORY, EXAMPLE, LOOPBACK],
                         ids=["local", "example", "loopback"])
@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=lambda p: p.name)
def test_syntax_check(playbook, inventory) -> None:
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory),
                           str(playbook), "--syntax-check"], cwd=REPO, env=ansible_env(),
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ansible_lint_production_profile() -> None:
    targets = [str(p.relative_to(REPO)) for p in PLAYBOOKS] + ["ansible/roles",
                                                              "ansible/inventories",
                                                              "ansible/molecule"]
    proc = subprocess.run([str(VENV_BIN / "ansible-lint"), "--offline", "--profile", "production",
                           "--nocolor", *targets],
                          cwd=REPO, env=ansible_env(), capture_output=True, text=True,
                          check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr
