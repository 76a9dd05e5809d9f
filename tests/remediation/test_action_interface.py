"""The engine calls actions only through their interface (remediation/actions/base.py): it
names no action, and an action is one module the registry finds."""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

from trainwatch.remediation import actions, engine
from trainwatch.remediation.actions.base import Action
from trainwatch.remediation.actions.registry import ACTIONS
from trainwatch.remediation.decisions import Decision


def test_the_engine_names_no_action() -> None:
    source = Path(engine.__file__).read_text()
    modules = {info.name for info in pkgutil.iter_modules(actions.__path__)} - {"base",
                                                                                 "registry"}
    names = set(ACTIONS) | modules
    assert {"quarantine", "silence", "http", "ansible", "training_command"} <= names
    named = sorted(n for n in names if re.search(rf"\b{re.escape(n)}\b", source, re.I))
    assert named == [], f"remediation/engine.py names {named}: call the Action interface"


def test_every_action_module_registers_one_action_by_its_name() -> None:
    for name, action in ACTIONS.items():
        assert isinstance(action, Action) and action.name == name
        assert type(action).run is not Action.run, f"{name} has no run step"


def test_decisions_are_one_enum_that_reads_as_the_stored_text() -> None:
    assert Decision.AWAITING_APPROVAL == "awaiting_approval"
    assert len({d.value for d in Decision}) == len(Decision)
