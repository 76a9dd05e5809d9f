"""Resolve host names from alert labels to hosts of the configured Ansible inventory, exactly.

Why this exists: Ansible reads a `--limit` value as a host *pattern* (`all`, `*`, group names,
unions `a:b`, intersections `&g`, exclusions `!h`, regexes `~re`, ranges `h[1:3]`, commas), so a
label value passed through as a limit could address many hosts at once. Here a name is accepted
only when it is, character for character, one host of the inventory, contains no pattern
syntax at all, and is not also a group name; the limit built from accepted names is then
evaluated by Ansible's own InventoryManager (the parser ansible-playbook uses on the same file)
and must select exactly those hosts. Anything else raises TargetError, whose message is the
audit reason for the refusal.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

from trainwatch.remediation.labels import LabelError

# Every character that means something in an Ansible host pattern or a --limit value:
# separators (`:` `,`), operators (`&` `!`), regex and glob (`~` `*` `?`), ranges (`[` `]`),
# a limit file (`@`), and whitespace.
PATTERN_SYNTAX = re.compile(r"[:,&!~*?\[\]@\s]")

# Ansible's inventory and plugin loader keep process-wide state: parse one inventory at a time.
_LOAD_LOCK = threading.Lock()


class TargetError(LabelError):
    """A target label does not name exactly one inventory host; the message says why."""


def _prepare_ansible(state: Path) -> None:
    """Ansible reads its settings and creates its local temp dir when first imported: point
    them at the service's writable state dir first (its home is read-only in its unit)."""
    for key, sub in (("ANSIBLE_HOME", "home"), ("ANSIBLE_LOCAL_TEMP", "tmp")):
        (state / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ.setdefault(key, str(state / sub))


def _load(path: Path, state: Path):  # type: ignore[no-untyped-def]  # ansible has no hints
    if not path.exists():
        raise TargetError(f"inventory {path} does not exist")
    with _LOAD_LOCK:
        _prepare_ansible(state)
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader

        try:
            return InventoryManager(loader=DataLoader(), sources=[str(path)])
        except AnsibleError as exc:
            raise TargetError(f"inventory {path} cannot be read: {exc}") from exc


def resolve_hosts(inventory: Path | None, names: Iterable[str], state: Path) -> list[str]:
    """The inventory hosts that `names` name exactly, in order; TargetError for anything else.

    `state` is a writable directory for Ansible's own files. The returned names are safe to
    join with ':' into a --limit: each is verified to select only itself, and the joined
    limit is verified to select exactly this set.
    """
    wanted = list(dict.fromkeys(names))
    if inventory is None:
        raise TargetError("no ansible_inventory is configured: host actions are refused")
    if not wanted:
        raise TargetError("no target host")
    for name in wanted:
        if not name or PATTERN_SYNTAX.search(name) or name.startswith("-"):
            raise TargetError(f"target {name!r} contains Ansible host-pattern syntax")
    manager = _load(inventory, state)
    for name in wanted:
        if name not in manager.hosts:
            raise TargetError(f"target {name!r} is not a host of the inventory {inventory}")
        if name in manager.groups:
            raise TargetError(f"target {name!r} is also a group name in {inventory}: ambiguous")
    limit = ":".join(wanted)
    selected = {host.name for host in manager.get_hosts(pattern=limit, ignore_restrictions=True)}
    if selected != set(wanted):
        raise TargetError(f"limit {limit!r} would select {sorted(selected)!r}, not exactly "
                          f"{wanted!r}")
    return wanted
