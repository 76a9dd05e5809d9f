"""examples/train_ddp.py's --fault-file reader (issue 41's chaos soak injects nan and spike
through it): a new id is returned once, also to a reader started again on the same file (a
restarted job), and content that is not a fault is ignored with one clear line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _example() -> ModuleType:
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import train_ddp
    finally:
        sys.path.remove(str(REPO / "examples"))
    return train_ddp


train_ddp = _example()


def _write(path: Path, content: str, bump: int) -> None:
    """Write `content` with an mtime of its own: two writes within the filesystem's
    timestamp granularity must still read as a change (the reader keys on mtime and size)."""
    path.write_text(content)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000_000))


def test_a_new_id_is_returned_once_and_not_again_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "fault.json"
    reader = train_ddp.FaultTrigger(str(path))
    assert reader.poll() is None  # no file yet: nothing
    _write(path, json.dumps({"id": "f1", "kind": "nan"}), 1)
    assert reader.poll() == ("f1", "nan")
    assert reader.poll() is None  # unchanged file: one stat, nothing read
    _write(path, json.dumps({"id": "f1", "kind": "nan"}) + " ", 2)  # rewritten, same id
    assert reader.poll() is None
    _write(path, json.dumps({"id": "f2", "kind": "spike"}), 3)
    assert reader.poll() == ("f2", "spike")
    again = train_ddp.FaultTrigger(str(path))  # the job restarted: f2 stays applied
    assert again.poll() is None
    assert (tmp_path / "fault.json.applied").read_text().split() == ["f1", "f2"]


@pytest.mark.parametrize(("content", "why"), [
    ("{not json", "unreadable (JSONDecodeError"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"kind": "nan"}), "id None is not a one-line string"),
    (json.dumps({"id": "a\nb", "kind": "nan"}), "is not a one-line string"),
    (json.dumps({"id": "f3", "kind": "oom"}), "kind 'oom' is not one of ['nan', 'spike']"),
])
def test_bad_content_is_ignored_with_one_line_per_change(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, why: str) -> None:
    path = tmp_path / "fault.json"
    reader = train_ddp.FaultTrigger(str(path))
    _write(path, content, 1)
    assert reader.poll() is None
    assert reader.poll() is None  # the same bad file: not read, not logged again
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and f"fault file {path} ignored: " in lines[0] and why in lines[0]
    _write(path, json.dumps({"id": "f3", "kind": "spike"}), 2)  # fixed: applied
    assert reader.poll() == ("f3", "spike")


def test_the_option_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(train_ddp.FAULT_FILE_ENV, "/x/fault.json")
    assert train_ddp.parse_args([]).fault_file == "/x/fault.json"
    assert train_ddp.parse_args(["--fault-file", "/y"]).fault_file == "/y"
    monkeypatch.delenv(train_ddp.FAULT_FILE_ENV)
    assert train_ddp.parse_args([]).fault_file is None
