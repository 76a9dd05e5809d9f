"""Typed remediation actions, one module each; `ACTIONS` maps a step's `action` to its runner.

Every runner has the signature `run(step, ctx) -> dict` (a JSON-able result for the audit) and
raises ActionError on failure. Runners must be safe to repeat: a crash between doing the work
and recording it makes the worker run the step again, so each passes an idempotency key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from remediation.actions import ansible, http, silence, training_command
from remediation.actions.base import ActionContext, ActionError

Runner = Callable[[dict[str, Any], ActionContext], dict[str, Any]]

ACTIONS: dict[str, Runner] = {
    "training_command": training_command.run,
    "ansible": ansible.run,
    "silence": silence.run,
    "http": http.run,
}

__all__ = ["ACTIONS", "ActionContext", "ActionError", "Runner"]
