"""What the roles read from each other has a public name, documented where it is defined.

A role's `_<role>_*` variables are its internals (prometheus-community's convention): another
role, a playbook or compose/render.yml reading one would break silently when the owner changes
it. The shared role's outputs (prefix layout, token files, the service manager) are public
`trainwatch_*` names listed in its README; every service role depends on it (meta/main.yml)
instead of each play listing it. The shared role is `_common` (prometheus.prometheus's name
for it); its public names and internals keep the `trainwatch_` / `_trainwatch_` prefix users
set them with.

Nothing in the collection reaches outside its own role by path (a sibling role, the
repository): what a role needs travels inside the collection (scripts/collection.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.ansible.runner import ANSIBLE, REPO

ROLES = ANSIBLE / "roles"
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if (p / "tasks").is_dir())
SHARED = "_common"
PLAYBOOKS = [ANSIBLE / "playbooks" / "site.yml", ANSIBLE / "playbooks" / "stop.yml"]
# The variable prefix of each role: its name, but the shared role's is `trainwatch`.
VAR_PREFIX = {role: "trainwatch" if role == SHARED else role for role in ROLE_NAMES}


def owner_of(name: str) -> str | None:
    """The role a `_<prefix>_...` variable belongs to (longest prefix)."""
    for role in sorted(ROLE_NAMES, key=lambda r: len(VAR_PREFIX[r]), reverse=True):
        if name.startswith(f"_{VAR_PREFIX[role]}_"):
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
    for path in PLAYBOOKS:
        wrong += [f"{path.relative_to(REPO)}: {name}" for name in private_reads(path)]
    assert not wrong, "\n".join(sorted(wrong))


def test_every_service_role_depends_on_the_shared_role() -> None:
    for role in ROLE_NAMES:
        if role == SHARED:
            continue
        meta = yaml.safe_load((ROLES / role / "meta" / "main.yml").read_text())
        assert {"role": f"trainwatch.stack.{SHARED}"} in meta["dependencies"], role
    for play in yaml.safe_load(PLAYBOOKS[0].read_text()):
        roles = [r["role"] for r in play.get("roles", [])]
        assert f"trainwatch.stack.{SHARED}" not in roles, play["name"]
        assert all(r.startswith("trainwatch.stack.") for r in roles), play["name"]


def test_the_shared_roles_outputs_are_documented() -> None:
    outputs = yaml.safe_load((ROLES / SHARED / "vars" / "main.yml").read_text())
    readme = (ROLES / SHARED / "README.md").read_text()
    used_elsewhere = set()
    for role in ROLE_NAMES:
        if role == SHARED:
            continue
        for path in (ROLES / role).rglob("*.yml"):
            used_elsewhere |= set(re.findall(r"\btrainwatch_[a-z0-9_]+", path.read_text()))
    public = {name for name in outputs if not name.startswith("_")}
    assert public, "the shared role exports no public names"
    for name in sorted(public & used_elsewhere):
        assert f"`{name}`" in readme, f"{name} is read by other roles but not in the README"


# A path that leaves the role (or the plugin's folder) it is written in.
REACHING_OUT = re.compile(r"role_path\s*\}\}\s*/\s*\.\.|role_path\s*~\s*'/\.\.|"
                          r"parents\[|\.\./")


def test_nothing_in_the_collection_reaches_outside_itself_by_path() -> None:
    """No role reads a sibling role or the repository through a path: the restart/reload
    path is an include_role of the shared role, the contract a lookup plugin reading its
    built-in copy, rules, dashboards, the Alertmanager template and the remediation playbooks
    are built into the roles that use them."""
    shipped = [p for p in ANSIBLE.rglob("*") if p.is_file()
               and not {"inventories", "molecule"} & set(p.relative_to(ANSIBLE).parts)
               and p.suffix in {".yml", ".j2", ".py", ".md"}]
    assert any(p.suffix == ".py" for p in shipped)
    wrong = [f"{p.relative_to(REPO)}:{n}: {line.strip()}"
             for p in shipped for n, line in enumerate(p.read_text().splitlines(), 1)
             if REACHING_OUT.search(line)]
    assert not wrong, "\n".join(wrong)
    # a checkout is only an install source the inventory names, never a default
    defaults = yaml.safe_load((ROLES / SHARED / "defaults" / "main.yml").read_text())
    assert defaults["trainwatch_repo_root"] == ""
