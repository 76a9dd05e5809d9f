"""The shared writer of the generators' output folders (alert rules, dashboards)."""

from __future__ import annotations

from pathlib import Path

from alert_rules.generated_files import write_folder


def test_writes_files_and_removes_only_stale_matching_ones(tmp_path: Path) -> None:
    folder = tmp_path / "generated"
    folder.mkdir()
    (folder / "old.yml").write_text("dropped output")
    (folder / "keep.yml").write_text("old text")
    (folder / "notes.txt").write_text("not ours: the glob does not match it")
    written = write_folder(folder, {"keep.yml": "new", "new.yml": "fresh"}, "*.yml")
    assert written == [folder / "keep.yml", folder / "new.yml"]
    assert sorted(p.name for p in folder.iterdir()) == ["keep.yml", "new.yml", "notes.txt"]
    assert (folder / "keep.yml").read_text() == "new"


def test_creates_a_missing_folder(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b"
    assert write_folder(folder, {"x.json": "{}"}, "*.json") == [folder / "x.json"]
