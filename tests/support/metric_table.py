"""Compare a /metrics page with the metric table (exporters/contract/catalog.py METRICS).

An exporter's exposition is derived from the table, so these checks catch code that bypasses
it: a family served under a name, type, HELP text or label the table does not say.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from trainwatch.exporters.contract import catalog

# Families prometheus_client's default collectors add (process, platform, GC): not ours.
FOREIGN_PREFIXES = ("process_", "python_")
_SUFFIX_LABELS = {"histogram": {"le"}}


def _row_for(family_name: str, kind: str) -> catalog.Metric | None:
    name = family_name + "_total" if kind == "counter" else family_name
    return catalog.METRICS.get(name)


def _created_of_a_row(family_name: str) -> bool:
    """prometheus_client's `<name>_created` companion of a counter or histogram row (the
    text format 0.0.4 writes it as a gauge family of its own)."""
    base = family_name.removesuffix("_created")
    return base != family_name and (base in catalog.METRICS or base + "_total" in catalog.METRICS)


def mismatches(text: str, exporter: str, *, complete: bool) -> list[str]:
    """What the page says differently from the exporter's rows; `complete`: every row must be
    served with every label it declares (a scrape that exercises all of them)."""
    problems, served = [], set()
    for family in text_string_to_metric_families(text):
        if family.name.startswith(FOREIGN_PREFIXES) or _created_of_a_row(family.name):
            continue
        row = _row_for(family.name, family.type)
        if row is None or row.exporter != exporter:
            problems.append(f"{family.name}: served by {exporter} but not its row in the table")
            continue
        served.add(row.name)
        if family.type != row.type or family.documentation != row.help:
            problems.append(f"{row.name}: served as {family.type} {family.documentation!r}, "
                            f"table says {row.type} {row.help!r}")
        labels = set().union(*(s.labels for s in family.samples)) - _SUFFIX_LABELS.get(
            row.type, set())
        if labels - set(row.labels) or (complete and family.samples
                                        and labels != set(row.labels)):
            problems.append(f"{row.name}: labels {sorted(labels)}, table says {row.labels}")
    if complete:
        problems += [f"{row.name}: in the table, not served" for row in
                     catalog.metrics_of(exporter) if row.name not in served]
    return problems
