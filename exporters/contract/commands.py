"""Command types, their argument schemas, and validation shared by the exporter and the ranks.

The exporter validates before it accepts a command (so a bad command gets a 400 and never
reaches a rank); the ranks validate again before applying (they may have learned a command
from a peer rank whose exporter is older or misconfigured). Both use the same JSON schemas,
and both refuse a NaN or infinite number anywhere in the arguments first: a schema's bounds
do not (every comparison with NaN is false), and a registered type's schema may have none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import referencing.exceptions

from trainwatch.exporters.contract.finite import first_non_finite
from trainwatch.exporters.contract.identity import JOB_NAME_PATTERN

# A command id has a job name's shape: both are URL path segments and label-safe ids.
COMMAND_ID_PATTERN = JOB_NAME_PATTERN
COMMAND_TYPE_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

SCALE_LR = "scale_lr"
ROLLBACK = "rollback"
CHECKPOINT = "checkpoint"

MAX_BATCH = 2**53  # batch positions: exact in a float, far beyond any run

BUILTIN_SCHEMAS: dict[str, dict[str, Any]] = {
    SCALE_LR: {
        "type": "object",
        "properties": {
            "factor": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "floor": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["factor"],
        "additionalProperties": False,
    },
    ROLLBACK: {
        "type": "object",
        "properties": {"skip_batches": {"type": "integer", "minimum": 0, "maximum": 10_000_000},
                       # the window the playbook names; default: the first bad batch seen
                       "skip_from_batch": {"type": "integer", "minimum": 0,
                                           "maximum": MAX_BATCH}},
        "additionalProperties": False,
    },
    CHECKPOINT: {"type": "object", "additionalProperties": False},
}

# What a script-registered type may take when it gives no schema: a flat object of scalars.
DEFAULT_CUSTOM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {"type": ["number", "string", "boolean", "null"]},
    "maxProperties": 32,
}


class CommandError(ValueError):
    """A command that must be refused; the message is safe to show to the caller."""


@dataclass(frozen=True)
class Command:
    """One instruction for every rank of a job, identified by a caller-chosen or server id."""

    id: str
    type: str
    args: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "args": self.args}


def _check_schema(schema: dict[str, Any], args: Any, what: str) -> None:
    try:
        jsonschema.validate(args, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "args"
        raise CommandError(f"{what}: {where}: {exc.message}") from None
    except (jsonschema.SchemaError, referencing.exceptions.Unresolvable) as exc:
        # The schema came from a rank's datagram; a broken one refuses the type, not the API.
        raise CommandError(f"{what}: the job registered an unusable schema: {exc}") from None


def validate(payload: Any, schemas: dict[str, dict[str, Any]]) -> Command:
    """Turn an untrusted {"id", "type", "args"} object into a Command or raise CommandError.

    `schemas` maps every type accepted for this job (built-ins plus registered ones) to its
    argument schema. A missing id is not an error here: the caller assigns one.
    """
    if not isinstance(payload, dict):
        raise CommandError("body must be a JSON object")
    unknown = set(payload) - {"id", "type", "args"}
    if unknown:
        raise CommandError(f"unknown fields: {sorted(unknown)}")
    command_id = payload.get("id", "")
    if command_id != "" and (not isinstance(command_id, str)
                             or not COMMAND_ID_PATTERN.fullmatch(command_id)):
        raise CommandError(f"id must match {COMMAND_ID_PATTERN.pattern}")
    command_type = payload.get("type")
    if not isinstance(command_type, str) or not COMMAND_TYPE_PATTERN.match(command_type):
        raise CommandError("type must be a lower-case identifier")
    if command_type not in schemas:
        raise CommandError(f"unknown command type {command_type!r}; this job accepts "
                           f"{sorted(schemas)}")
    args = payload.get("args", {})
    if args is None:
        args = {}
    bad = first_non_finite(args)
    if bad is not None:
        raise CommandError(f"{command_type}: {bad}: must be a finite number")
    _check_schema(schemas[command_type], args, command_type)
    return Command(id=command_id, type=command_type, args=dict(args))


def check_custom_schema(command_type: str, schema: dict[str, Any] | None) -> dict[str, Any]:
    """Validate a script-registered type name and schema (so a typo fails at registration)."""
    if not COMMAND_TYPE_PATTERN.match(command_type):
        raise ValueError(f"command type {command_type!r} must match {COMMAND_TYPE_PATTERN.pattern}")
    if command_type in BUILTIN_SCHEMAS:
        raise ValueError(f"{command_type!r} is a built-in command type")
    schema = DEFAULT_CUSTOM_SCHEMA if schema is None else schema
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema
