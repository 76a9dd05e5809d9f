"""Published JSON schemas (config, webhook payload, playbook) and their validators."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from jsonschema import Draft202012Validator

from trainwatch.exporters.contract.finite import first_non_finite


@cache
def validator(name: str) -> Draft202012Validator:
    """The validator for `<name>.schema.json`, compiled once per process."""
    text = resources.files(__package__).joinpath(f"{name}.schema.json").read_text()
    schema = json.loads(text)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def first_error(name: str, document: object, *,
                using: Draft202012Validator | None = None) -> str | None:
    """A one-line description of the first schema violation, naming the key path; None if valid.

    A NaN or infinite number anywhere is a violation of every schema here, checked first:
    `json.loads` and YAML (`.nan`, `.inf`) produce them, and a schema's numeric bounds let NaN
    through (every comparison with it is false), so a cooldown, a rate limit or a training
    command's argument could otherwise be NaN. `using`: a validator derived from the named
    schema (the playbook schema with the steps of the registered actions).
    """
    bad = first_non_finite(document)
    if bad is not None:
        return f"{bad}: must be a finite number"
    errors = sorted((using or validator(name)).iter_errors(document),
                    key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    err = errors[0]
    path = "/".join(str(p) for p in err.absolute_path) or "<top level>"
    return f"{path}: {err.message[:300]}"
