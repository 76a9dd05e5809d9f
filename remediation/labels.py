"""Label values are attacker-influenced text: only an allowlisted shape may be used anywhere,
and each target has exactly one spelling.

A value that reaches a URL, an Ansible --limit or extra var, or a process lookup must match
SAFE_VALUE as a whole (`fullmatch`; a `$`-anchored `match` also accepts a trailing newline):
letters, digits and `._:-`, not starting with `-` or `.` (so no option injection, no `..`, no
`/`, no shell metacharacters, no whitespace).

Why canonical spellings: the cooldown and rate-limit key is made from the target labels, but
what acts on the target reads them its own way. The GPU power-limit playbook took `07`, `7`
and `7` followed by a newline as GPU 7 (Jinja's `| int`, Python's `int()`), while the service
keyed them apart, so the limit was cut four times inside one cooldown. So every target label
is brought to one spelling here, before any key, cooldown or command is made from it
(trainwatch.remediation.ingest.target_key and the engine's action labels both come from
`safe_labels`), and the consumers accept only that spelling:

- index labels (`gpu`, `rank`): a decimal integer in range; leading zeros are dropped
  ("007" -> "7"), anything else (sign, space, `_`, `.`, exponent) is refused;
- `training_job`: the job-name shape the training exporter accepts
(trainwatch.exporters.contract.identity);
- `node` and every other label: the value exactly, which the host action then resolves
  character for character against the inventory (trainwatch.remediation.inventory).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from trainwatch.exporters.contract.catalog import LABEL_GPU, LABEL_JOB, LABEL_RANK
from trainwatch.exporters.contract.identity import is_job_name

SAFE_VALUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:-]{0,127}")  # always used with fullmatch
INDEX_VALUE = re.compile(r"[0-9]{1,16}")
# index label -> its largest value (a GPU index as NVML and
# trainwatch.exporters.node.tools.power_limit take
# it;
# a rank as the training exporter's wire format bounds it)
INDEX_LABELS = {LABEL_GPU: 999, LABEL_RANK: 1 << 20}


class LabelError(ValueError):
    """A required label is missing or its value is not allowed; the message is the audit reason."""


def _index(name: str, value: str) -> str:
    if not INDEX_VALUE.fullmatch(value) or int(value) > INDEX_LABELS[name]:
        raise LabelError(f"label {name!r} must be a decimal index 0-{INDEX_LABELS[name]}")
    return str(int(value))


def _job(name: str, value: str) -> str:
    if not is_job_name(value):
        raise LabelError(f"label {name!r} is not a training job name")
    return value


CANONICAL: dict[str, Callable[[str, str], str]] = {
    **{label: _index for label in INDEX_LABELS}, LABEL_JOB: _job}


def canonical(name: str, value: str | None) -> str:
    """The one spelling of label `name`'s value, or LabelError (fail closed)."""
    if value is None or value == "":
        raise LabelError(f"missing target label {name!r}")
    if not isinstance(value, str) or not SAFE_VALUE.fullmatch(value):
        raise LabelError(f"label {name!r} has a value outside the allowlist")
    convert = CANONICAL.get(name)
    return convert(name, value) if convert else value


def safe_labels(labels: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The named labels, each present, allowlisted and in its canonical spelling, else
    LabelError (fail closed)."""
    return {name: canonical(name, labels.get(name)) for name in names}
