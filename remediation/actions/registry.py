"""The action registry: every module of this package with an `ACTION` (an
trainwatch.remediation.actions.base.Action) is an action, found by name (`ACTIONS`), so a new
action is one module and the engine never names one.

Kept out of the package's __init__ so that importing one action module (the torchrun elastic
scheduler runs the `ansible` action to stop an agent) does not import every action, quarantine
among them, which imports the schedulers: that was an import cycle.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, Mapping
from typing import Any

from trainwatch.remediation import actions as package
from trainwatch.remediation.actions.base import Action
from trainwatch.remediation.config import Config


def _discover() -> dict[str, Action]:
    found: dict[str, Action] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        action = getattr(module, "ACTION", None)
        if not isinstance(action, Action):
            continue
        if action.name in found:
            raise RuntimeError(f"two actions named {action.name!r}")
        found[action.name] = action
    return found


ACTIONS: Mapping[str, Action] = _discover()


def check_targets(steps: Iterable[dict[str, Any]], labels: Mapping[str, str],
                  config: Config) -> None:
    """Run every step's target check (Action.check) before anything is granted; the first
    refusal raises trainwatch.remediation.labels.LabelError: the engine refuses, audited, and
    never retries, because the same alert can never pass."""
    for step in steps:
        ACTIONS[step["action"]].check(step, labels, config)


def outlives_resolve(steps: Iterable[dict[str, Any]]) -> bool:
    """Whether an intent of these steps held for approval stays held past its alert's
    resolve (Action.outlives_resolve of any of them)."""
    return any(ACTIONS[step["action"]].outlives_resolve for step in steps)


def retries_when_fired_again(steps: Iterable[dict[str, Any]]) -> bool:
    """Whether a failed intent with these steps is tried again when its alert arrives again
    (Action.retries_when_fired_again)."""
    return any(ACTIONS[step["action"]].retries_when_fired_again for step in steps)


__all__ = ["ACTIONS", "check_targets", "outlives_resolve", "retries_when_fired_again"]
