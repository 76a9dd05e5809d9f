"""The action registry: `ACTIONS` maps a step's `action` to its runner, `CHECKS` to the checks
it makes before anything is granted.

Kept out of the package's __init__ so that importing one action module (the torchrun elastic
scheduler runs the `ansible` action to stop an agent) does not import every action, quarantine
among them, which imports the schedulers: that was an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trainwatch.remediation.actions import ansible, http, quarantine, silence, training_command
from trainwatch.remediation.actions.base import ActionContext
from trainwatch.remediation.config import Config

Runner = Callable[[dict[str, Any], ActionContext], dict[str, Any]]

ACTIONS: dict[str, Runner] = {
    "training_command": training_command.run,
    "ansible": ansible.run,
    "silence": silence.run,
    "http": http.run,
    "quarantine": quarantine.run,
}

# Checks an action makes before anything is granted (e.g. that a host target names exactly one
# inventory host). Each raises trainwatch.remediation.labels.LabelError: the engine refuses,
# audited, and
# never retries, because the same alert can never pass.
Check = Callable[[dict[str, Any], Mapping[str, str], Config], None]
CHECKS: dict[str, Check] = {"ansible": ansible.check}


def check_targets(steps: Iterable[dict[str, Any]], labels: Mapping[str, str],
                  config: Config) -> None:
    """Run every step's target check; the first refusal raises LabelError."""
    for step in steps:
        check = CHECKS.get(step["action"])
        if check is not None:
            check(step, labels, config)


__all__ = ["ACTIONS", "CHECKS", "Runner", "check_targets"]
