"""Writing a generator's output folder, shared by the rule and dashboard generators.

Every generator writes its files and removes the ones it no longer generates (a renamed or
dropped output must not linger and keep being deployed); that is done here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def write_folder(folder: Path, files: Mapping[str, str], stale: str) -> list[Path]:
    """Write file name -> text under `folder` (created if missing) after removing the files
    matching the glob `stale` that are not in `files`; the paths written, in order."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(stale):
        if old.name not in files:
            old.unlink()
    written = []
    for name, text in files.items():
        (folder / name).write_text(text)
        written.append(folder / name)
    return written
