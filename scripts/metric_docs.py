"""The docs' metric, alert and XID tables, from their one source.

The sections between `<!-- generated: KIND -->` and `<!-- end generated: KIND -->` in the
pages below (SECTIONS) are this module's output: the metric table
(exporters/contract/catalog.py METRICS), the alert names (the keys of `alerts` in
alert_rules/config.yml) and the runbook's XID table (remediation/fault_classes.yaml). Edit
those sources, then run `python -m scripts.build`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from alert_rules.config import load_raw
from trainwatch.exporters.contract import catalog as c
from trainwatch.remediation.faults import load_table

EXPORTERS = {"training": "Training exporter (`training-exporter`)",
             "logscan": "Log scanner (`trainwatch-logscan`)",
             "gpu": "GPU exporter (`gpu-exporter`)",
             "remediation": "Remediation service (`remediation-server`)"}


def _code(items: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"`{item}`" for item in items)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def gpu_table() -> str:
    """docs/gpu_exporter.md: every GPU exporter row with its NVML source and DCGM twin."""
    lines = ["| metric | type | unit | labels beyond `gpu`, `uuid`, `name` | source (NVML) | "
             "dcgm-exporter twin |", "|---|---|---|---|---|---|"]
    for row in c.metrics_of("gpu"):
        per_gpu = row.labels[:len(c.GPU_LABELS)] == c.GPU_LABELS
        extra = row.labels[len(c.GPU_LABELS):] if per_gpu else row.labels
        labels = _code(extra) + ("" if per_gpu else " (no GPU labels)")
        lines.append(f"| `{row.name}` | {row.type} | {row.unit} | {labels} | "
                     f"{_cell(row.source)} | {_code(row.dcgm)} |")
    return "\n".join(lines)


def all_tables() -> str:
    """docs/contracts.md: every exporter's rows: name, type, unit, labels, HELP."""
    out = []
    for exporter, title in EXPORTERS.items():
        out += [f"{title}:", "", "| metric | type | unit | labels | help |",
                "|---|---|---|---|---|"]
        out += [f"| `{row.name}` | {row.type} | {row.unit} | {_code(row.labels)} | "
                f"{_cell(row.help)} |" for row in c.metrics_of(exporter)]
        out.append("")
    return "\n".join(out).rstrip()


def alert_names() -> str:
    """docs/contracts.md: the alerts alert_rules/config.yml configures, in its order."""
    return _code(list(load_raw()["defaults"]["alerts"])) + "."


def xid_table() -> str:
    """docs/runbooks.md: every XID of the fault table, by class in the table's order: what it
    means, its class and automatic action, its alert's severity, what on-call does."""
    table = load_table()
    lines = ["| XID | meaning (NVIDIA's name) | class (automatic action) | severity | "
             "what you do |", "|---|---|---|---|---|"]
    for cls in table.xid_classes():
        fault = table.classes[cls]
        for xid in table.xids_of(cls):
            entry = table.xids[xid]
            lines.append(f"| {xid} | {_cell(entry.meaning)} (`{entry.mnemonic}`) | "
                         f"{cls} ({fault.action}) | {fault.severity} | "
                         f"{_cell(entry.advice or fault.advice)} |")
    unknown = table.classes[table.unknown_xid]
    lines.append(f"| any other | not in the table | {unknown.name} ({unknown.action}) | "
                 f"{unknown.severity} | {_cell(unknown.advice)} |")
    return "\n".join(lines)


# kind -> (page, relative to the repository root; what fills its section)
SECTIONS: dict[str, tuple[Path, Callable[[], str]]] = {
    "gpu-metrics": (Path("docs", "gpu_exporter.md"), gpu_table),
    "metrics": (Path("docs", "contracts.md"), all_tables),
    "alerts": (Path("docs", "contracts.md"), alert_names),
    "xid-classes": (Path("docs", "runbooks.md"), xid_table),
}


def _pattern(kind: str) -> re.Pattern[str]:
    begin, end = f"<!-- generated: {kind} -->", f"<!-- end generated: {kind} -->"
    return re.compile(rf"({begin}\n)(?:.*?\n)?({end})", re.DOTALL)


def render(text: str, kind: str, body: str) -> str:
    pattern = _pattern(kind)
    if not pattern.search(text):
        raise ValueError(f"no `<!-- generated: {kind} -->` section to fill")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
