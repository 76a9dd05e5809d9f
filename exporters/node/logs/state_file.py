"""Scanner offsets on disk: loaded at start, replaced atomically, so a restart resumes exactly.

The file is written to a temporary name in the same directory, fsynced and renamed over the
old one; a crash leaves either the old or the new state, never half of one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainwatch.exporters.contract.atomic_file import atomic_write_json

STATE_VERSION = 1


class StateFileError(ValueError):
    """The state file exists but is not one this scanner wrote."""


def load_state(path: Path | None) -> dict[str, Any]:
    """The saved state, or an empty one when there is no file yet."""
    if path is None or not path.exists():
        return {"version": STATE_VERSION, "files": {}, "kmsg_seq": None}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StateFileError(f"cannot read state file {path}: {exc}") from exc
    if (not isinstance(data, dict) or data.get("version") != STATE_VERSION
            or not isinstance(data.get("files"), dict)):
        raise StateFileError(f"state file {path} is not a version-{STATE_VERSION} scanner state")
    _check_offsets(path, data["files"])
    if "kernel_files" in data:
        if not isinstance(data["kernel_files"], dict):
            raise StateFileError(f"state file {path}: kernel_files is not a mapping")
        _check_offsets(path, data["kernel_files"])
    seq = data.setdefault("kmsg_seq", None)
    if seq is not None and not (isinstance(seq, int) and seq >= 0):
        raise StateFileError(f"state file {path}: kmsg_seq must be null or an integer >= 0")
    return data


def _check_offsets(path: Path, files: dict[str, Any]) -> None:
    for key, entry in files.items():
        if not (isinstance(entry, dict) and type(entry.get("offset")) is int
                and entry["offset"] >= 0 and isinstance(key, str)):
            raise StateFileError(f"state file {path}: bad entry for {key!r}")


def save_state(path: Path, state: dict[str, Any]) -> None:
    """Replace `path` with `state` atomically (temp file, fsync, rename), mode 0600."""
    atomic_write_json(path, state, separators=(",", ":"))
