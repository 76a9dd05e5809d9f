"""Crash-safe file replacement, shared by every part that rewrites a file in place.

Checkpoints and their manifest, the log scanner's offsets, the power-limit tool's saved limits
and the disk-cleanup tool's manifest rewrite all need the same guarantee: after a crash or a
`kill -9` at any instant, the path holds either the old content or the new, never half of one.
So: write a temporary file in the same directory (same filesystem, so the rename is atomic),
fsync it, rename it over the target, then fsync the directory so the rename itself is durable.
The temporary file is created mode 0600 (mkstemp), so nothing is ever briefly world-readable.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Replace `path` with what `write(fileobj)` writes; all or nothing."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_json(path: Path, document: Any, **dumps_options: Any) -> None:
    """Replace `path` with `document` as JSON; all or nothing."""
    data = json.dumps(document, **dumps_options).encode()
    atomic_write(path, lambda handle: handle.write(data))
