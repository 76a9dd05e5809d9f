"""What the roles read from each other has a public name, documented where it is defined.

A role's `_<role>_*` variables are its internals (prometheus-community's convention): another
role, a playbook or compose/render.yml reading one would break silently when the owner changes
it. The shared role's outputs (prefix layout, token files, the service manager) are public
`trainwatch_*` names listed in its README; every service role depends on it (meta/main.yml)
instead of each play listing it.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.ansible.runner import ANSIBLE, REPO

ROLES = ANSIBLE / "roles"
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if (p / "tasks").is_dir())


def owner_of(name: str) -> str | None:
    """The role a `_<role>_...` variable belongs to (longest role-name prefix)."""
    for role in sorted(ROLE_NAMES, key=len, reverse=True):
        if name.startswith(f"_{role}_"):
            return role
    return None


def private_reads(path: Path) -> set[str]:
    text = path.read_text()
    return {m.group(0) for m in re.finditer(r"(?<![\w.])_[a-z][a-z0-9_]*", text)
            if owner_of(m.group(0))}


def test_no_role_reads_another_roles_internals() -> None:
    wrong = []
    for role in ROLE_NAMES:
        for path in sorted((ROLES / role).rglob("*")):
            if path.suffix not in {".yml", ".j2"} or not path.is_file():
                continue
            for name in private_reads(path):
                if owner_of(name) != role:
                    wrong.append(f"{path.relative_to(REPO)}: {name}")
    for path in [ANSIBLE / "deploy.yml", ANSIBLE / "stop.yml"]:
        wrong += [f"{path.relative_to(REPO)}: {name}" for name in private_reads(path)]
    assert not wrong, "\n".join(sorted(wrong))


def test_every_service_role_depends_on_the_shared_role() -> None:
    for role in ROLE_NAMES:
        if role == "trainwatch":
            continue
        meta = yaml.safe_load((ROLES / role / "meta" / "main.yml").read_text())
        assert {"role": "trainwatch"} in meta["dependencies"], role
    for play in yaml.safe_load((ANSIBLE / "deploy.yml").read_text()):
        assert "trainwatch" not in [r["role"] for r in play.get("roles", [])], play["name"]


def test_the_shared_roles_outputs_are_documented() -> None:
    outputs = yaml.safe_load((ROLES / "trainwatch" / "vars" / "main.yml").read_text())
    readme = (ROLES / "trainwatch" / "README.md").read_text()
    used_elsewhere = set()
    for role in ROLE_NAMES:
        if role == "trainwatch":
            continue
        for path in (ROLES / role).rglob("*.yml"):
            used_elsewhere |= set(re.findall(r"\btrainwatch_[a-z0-9_]+", path.read_text()))
    public = {name for name in outputs if not name.startswith("_")}
    assert public, "the shared role exports no public names"
    for name in sorted(public & used_elsewhere):
        assert f"`{name}`" in readme, f"{name} is read by other roles but not in the README"
