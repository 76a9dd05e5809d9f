"""One place for each per-rank number: the catalog row names it, the rank counts it.

The training client and its shipper share a typed object (exporters/rank/counters.py)
instead of the shipper reading the client's private attributes; the datagram's per-rank
fields, the training exporter's rank state and its metric mapping all come from the
catalog rows with a `wire` name, so adding a per-rank counter is one row and one field.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import tokenize
from pathlib import Path

from trainwatch.exporters.contract import catalog, wire
from trainwatch.exporters.node.training.collector import TrainingCollector
from trainwatch.exporters.node.training.store import Store
from trainwatch.exporters.rank.counters import RankCounters

ROOT = Path(__file__).resolve().parents[2]
SHIPPER = ROOT / "exporters/rank/shipper.py"
# What takes each per-rank number from the catalog rows and must never spell one: the
# datagram's decoder and the node side that keeps and serves it.
ROW_DRIVEN = [ROOT / "exporters/contract/wire.py",
              *sorted((ROOT / "exporters/node/training").glob("*.py"))]


def test_the_shipper_reads_nothing_private_of_another_object() -> None:
    """Fails on the shipper that took `monitor: Any` and read 18 of its `_` attributes."""
    tree = ast.parse(SHIPPER.read_text())
    reach = [f"line {node.lineno}: .{node.attr}" for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr.startswith("_")
             and not node.attr.startswith("__")
             and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]
    assert reach == []
    (shipper,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                  and n.name == "Shipper"]
    untyped = [a.arg for f in ast.walk(shipper) if isinstance(f, ast.FunctionDef)
               for a in f.args.args + f.args.kwonlyargs
               if isinstance(a.annotation, ast.Name) and a.annotation.id == "Any"]
    assert untyped == []  # what it is given is typed (it took `monitor: Any`)


def _spellings(path: Path, names: set[str],
               kinds: tuple[int, ...] = (tokenize.NAME, tokenize.STRING)) -> list[str]:
    """Identifiers and string literals in `path` that are exactly one of `names`."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type not in kinds:
            continue
        text = tok.string
        if tok.type == tokenize.STRING:
            try:
                text = ast.literal_eval(text)
            except (ValueError, SyntaxError):  # f-strings
                continue
        if text in names:
            found.append(f"{path.relative_to(ROOT)}:{tok.start[0]}: {text}")
    return found


def test_per_rank_numbers_are_spelled_only_in_the_catalog_and_the_counters() -> None:
    """Fails on the code where `checkpoint_failures` was spelled in five files: the datagram
    decoder, the store and the collector take every name from the rows, and the shipper
    writes no datagram key of its own (it counts `dropped` and late non-finite losses into
    the shared counters, by attribute)."""
    names = {row.wire for row in catalog.RANK_WIRE}
    assert "checkpoint_failures" in names
    spelled = [s for path in ROW_DRIVEN for s in _spellings(path, names)]
    spelled += _spellings(SHIPPER, names, (tokenize.STRING,))
    assert spelled == []


def test_the_counters_are_the_catalog_rows() -> None:
    """A row with a wire name and no counter (or the reverse) fails here, not in a job."""
    fields = {f.name for f in dataclasses.fields(RankCounters)}
    per_thread = {"nonfinite_reported", "nonfinite_late", "applied_counts"}
    wired = {row.wire for row in catalog.RANK_WIRE}
    assert fields - per_thread == wired - {"nonfinite"}
    assert isinstance(RankCounters.nonfinite, property)
    assert all(row.exporter == "training" and row.labels == catalog.TRAINING_LABELS
               for row in catalog.RANK_WIRE)


def test_every_row_travels_from_the_counters_to_the_scrape() -> None:
    """Each counter set on the rank side arrives under its own row's metric, with the type
    the row says (a JSON integer for counts), and a sparse row is absent at 0."""
    counters = RankCounters()
    for i, row in enumerate(catalog.RANK_WIRE, start=1):
        if row.wire != "nonfinite":
            setattr(counters, row.wire, row.wire_type(i))
    counters.nonfinite_reported, counters.nonfinite_late = 2, 1
    message = {"v": wire.VERSION, "job": "rows", "rank": 0, "world_size": 1,
               **counters.wire()}
    for row in catalog.RANK_WIRE:
        assert type(message[row.wire]) is row.wire_type, row.wire
    report = wire.decode(wire.encode(message))
    store = Store(600)
    store.ingest(report)
    scraped = {s.name: s.value for family in TrainingCollector(store, "n").collect()
               for s in family.samples if s.labels.get(catalog.LABEL_JOB) == "rows"}
    for row in catalog.RANK_WIRE:
        expected = 3 if row.wire == "nonfinite" else getattr(counters, row.wire)
        assert scraped[row.name] == expected, row.name
    store = Store(600)
    store.ingest(wire.decode(wire.encode({**message, **RankCounters().wire()})))
    scraped_zero = {s.name for family in TrainingCollector(store, "n").collect()
                    for s in family.samples if s.labels.get(catalog.LABEL_JOB) == "rows"}
    for row in catalog.RANK_WIRE:
        assert (row.name in scraped_zero) is not row.sparse, row.name

