"""Playbook files: load, validate against schemas/playbook.schema.json, and match alerts."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

from trainwatch.exporters.contract import commands as training_commands
from trainwatch.exporters.contract.catalog import LABEL_JOB
from trainwatch.remediation.actions.registry import ACTIONS
from trainwatch.remediation.durations import seconds
from trainwatch.remediation.schemas import first_error, validator
from trainwatch.remediation.templating import referenced_labels

# `cooldown_ends_on` value: an alert that began after the last action, once the job stepped
# since that action, is a new event (trainwatch.remediation.engine.same_event)
COOLDOWN_ENDS_ON_PROGRESS = "job_progress"


class PlaybookError(ValueError):
    """A playbook file that cannot be used; the message names the file and the bad key."""


@dataclass(frozen=True)
class LabelMatcher:
    name: str
    op: str  # equals | not_equals | regex
    value: str
    pattern: re.Pattern[str] | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "equals":
            return actual == self.value
        if self.op == "not_equals":
            return actual != self.value
        assert self.pattern is not None
        return self.pattern.fullmatch(actual) is not None  # anchored, like Prometheus


@dataclass(frozen=True)
class Playbook:
    name: str
    alertnames: frozenset[str]
    matchers: tuple[LabelMatcher, ...]
    target: tuple[str, ...]
    steps: tuple[dict[str, Any], ...]
    on_resolve: tuple[dict[str, Any], ...] = ()
    cooldown_seconds: float = 0.0
    # COOLDOWN_ENDS_ON_PROGRESS: the cooldown holds only against the same event (the engine's
    # same_event); None: against every alert on the target
    cooldown_ends_on: str | None = None
    rate_limit_count: int | None = None
    rate_limit_window_seconds: float = 0.0
    dry_run: bool = False
    requires_approval: bool = False
    observe_only: bool = False  # quarantine playbooks: audit what would be done, page, act not
    priority: str = "normal"  # low | normal | high: which circuit breaker it answers to
    used_labels: frozenset[str] = field(default_factory=frozenset)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return labels.get("alertname") in self.alertnames and all(
            m.matches(labels) for m in self.matchers)


def _check_command_args(step: dict[str, Any], where: str) -> None:
    """A built-in training command's args must pass the schema the exporter and the ranks
    apply (bounds included), at load time rather than as a 400 in the middle of a play.
    Args filled from labels at run time are checked there (and by the exporter)."""
    if step["action"] != "training_command" or referenced_labels([step.get("args", {})]):
        return
    if step["command"] not in training_commands.BUILTIN_SCHEMAS:
        return
    try:
        training_commands.validate({"type": step["command"], "args": step.get("args", {})},
                                   training_commands.BUILTIN_SCHEMAS)
    except training_commands.CommandError as exc:
        raise PlaybookError(f"{where}/args: {exc}") from None


@functools.cache
def playbook_validator() -> Draft202012Validator:
    """schemas/playbook.schema.json with the step of every registered action that describes
    its own (Action.step_schema): a new action's step is described in its module."""
    schema = copy.deepcopy(validator("playbook").schema)
    schema["$defs"]["step"]["oneOf"].extend(
        action.step_schema for action in ACTIONS.values() if action.step_schema is not None)
    return Draft202012Validator(schema)


def parse_playbook(doc: object, source: Path) -> Playbook:
    """Validate one parsed playbook document and type it."""
    error = first_error("playbook", doc, using=playbook_validator())
    if error:
        raise PlaybookError(f"{source}: {error}")
    assert isinstance(doc, dict)
    matchers = []
    for name, spec in doc["match"].get("labels", {}).items():
        op, value = next(iter(spec.items()))
        pattern = None
        if op == "regex":
            try:
                pattern = re.compile(value)
            except re.error as exc:
                raise PlaybookError(f"{source}: match/labels/{name}/regex: {exc}") from exc
        matchers.append(LabelMatcher(name, op, value, pattern))
    steps = tuple(doc["steps"])
    on_resolve = tuple(doc.get("on_resolve", ()))
    for where, step in [*((f"steps/{i}", s) for i, s in enumerate(steps)),
                        *((f"on_resolve/{i}", s) for i, s in enumerate(on_resolve))]:
        _check_command_args(step, f"{source}: {where}")
    rate = doc.get("rate_limit")
    if doc.get("cooldown_ends_on") == COOLDOWN_ENDS_ON_PROGRESS \
            and LABEL_JOB not in doc["target"]:
        raise PlaybookError(f"{source}: cooldown_ends_on: {COOLDOWN_ENDS_ON_PROGRESS} reads "
                            f"the job's progress: the target must name {LABEL_JOB}")
    used = set(doc["target"]) | referenced_labels([*steps, *on_resolve])
    for step in (*steps, *on_resolve):  # silence matchers copy label values into Alertmanager
        used.update(step.get("matchers", ()) if step["action"] == "silence" else ())
    return Playbook(
        name=doc["name"],
        alertnames=frozenset(doc["match"]["alertname"]),
        matchers=tuple(matchers),
        target=tuple(doc["target"]),
        steps=steps,
        on_resolve=on_resolve,
        cooldown_seconds=seconds(doc.get("cooldown", 0)),
        cooldown_ends_on=doc.get("cooldown_ends_on"),
        rate_limit_count=rate["count"] if rate else None,
        rate_limit_window_seconds=seconds(rate["window"]) if rate else 0.0,
        dry_run=bool(doc.get("dry_run", False)),
        requires_approval=bool(doc.get("requires_approval", False)),
        observe_only=bool(doc.get("observe_only", False)),
        priority=doc.get("priority", "normal"),
        used_labels=frozenset(used),
    )


def load_playbooks(directory: Path) -> dict[str, Playbook]:
    """Every *.yaml in `directory`; names must be unique. Any bad file stops the service."""
    books: dict[str, Playbook] = {}
    for path in sorted(directory.glob("*.yaml")):
        try:
            doc = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise PlaybookError(f"{path}: not valid YAML: {exc}") from exc
        book = parse_playbook(doc, path)
        if book.name in books:
            raise PlaybookError(f"{path}: name: duplicate playbook name {book.name!r}")
        books[book.name] = book
    if not books:
        raise PlaybookError(f"{directory}: no playbooks (*.yaml) found")
    return books


def matching(books: Mapping[str, Playbook], labels: Mapping[str, str]) -> list[Playbook]:
    return [b for b in books.values() if b.matches(labels)]
