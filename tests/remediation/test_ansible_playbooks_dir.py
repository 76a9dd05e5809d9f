"""Where the remediation service finds the Ansible playbooks of host actions when its config
names no `ansible_playbooks_dir`: in the installed trainwatch.stack collection, found the way
Ansible finds collections (ANSIBLE_COLLECTIONS_PATH first), never in a repository checkout.
A fresh interpreter each time: Ansible reads its configuration once, at import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.ansible.runner import ANSIBLE, REPO

PRINT_DEFAULT = ("from trainwatch.remediation.config import default_ansible_playbooks_dir\n"
                 "print(default_ansible_playbooks_dir())")


def default_dir(collections_path: Path, home: Path) -> Path:
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections_path), "HOME": str(home)}
    proc = subprocess.run([sys.executable, "-c", PRINT_DEFAULT], cwd=home, env=env,
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip())


def test_the_default_is_the_installed_collections_playbooks(ansible_collection: Path,
                                                           tmp_path: Path) -> None:
    found = default_dir(ansible_collection, tmp_path)
    assert found == (ansible_collection / "ansible_collections" / "trainwatch" / "stack"
                     / "playbooks" / "remediation")
    shipped = sorted(p.name for p in (ANSIBLE / "playbooks" / "remediation").glob("*.yml"))
    assert shipped and sorted(p.name for p in found.glob("*.yml")) == shipped
    assert REPO not in found.parents


def test_without_the_collection_the_default_names_where_ansible_looks_first(
        tmp_path: Path) -> None:
    empty = tmp_path / "collections"
    empty.mkdir()
    found = default_dir(empty, tmp_path)
    assert found == empty / "ansible_collections" / "trainwatch" / "stack" / "playbooks" / \
        "remediation"
    assert not found.exists()
