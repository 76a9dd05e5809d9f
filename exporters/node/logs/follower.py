"""Follow log files through rotation: files are known by (device, inode), not by name.

Each poll first reads every file already open to its end (so the tail of a file that was just
renamed by rotation is never lost), then opens files that newly match the patterns, then
forgets files that no longer match. Offsets only move past complete lines. A file that
shrank below its offset was truncated in place and is read again from the start.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from trainwatch.exporters.contract.identity import is_job_name
from trainwatch.exporters.node.logs.scanner import Source

_RANK_FILE = re.compile(r"^rank-(\d{1,6})\.jsonl(?:\.\d+)?$")
_MAX_READ = 4 * 1024 * 1024


def source_for(path: str, key: str, default_job: str = "", kernel: bool = False) -> Source:
    """Labels from the handler's layout `<dir>/<job>/rank-<r>.jsonl[.N]`, else the defaults."""
    if kernel:
        return Source(name=key, kernel=True)
    p = Path(path)
    match = _RANK_FILE.match(p.name)
    if match and is_job_name(p.parent.name):
        return Source(name=key, job=p.parent.name, rank=match.group(1))
    return Source(name=key, job=default_job)


@dataclass
class _Followed:
    handle: BinaryIO
    path: str
    offset: int
    source: Source


class FileFollower:
    """Reads new complete lines from files matching `patterns`; offsets live in `files_state`."""

    def __init__(self, patterns: Iterable[str], files_state: dict[str, Any],
                 default_job: str = "", kernel: bool = False,
                 on_error: Callable[[str, OSError], None] | None = None,
                 on_open: Callable[[Source], None] | None = None) -> None:
        self.patterns = list(patterns)
        self.state = files_state
        self.default_job = default_job
        self.kernel = kernel
        self.on_error = on_error or (lambda path, exc: None)
        self.on_open = on_open or (lambda source: None)
        self._open: dict[str, _Followed] = {}
        self._known_at_start = set(files_state)

    @property
    def followed(self) -> int:
        return len(self._open)

    def poll(self, sink: Callable[[Source, str], None]) -> int:
        """Read what is new everywhere; returns the number of bytes consumed."""
        consumed = sum(self._read(f, sink) for f in list(self._open.values()))
        matched: dict[str, str] = {}
        for pattern in self.patterns:
            for path in sorted(glob.glob(pattern)):
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if os.path.isfile(path):
                    matched.setdefault(f"{st.st_dev}:{st.st_ino}", path)
        for key, path in matched.items():
            followed = self._open.get(key)
            if followed is None:
                followed = self._start(key, path)
                if followed is None:
                    continue
                consumed += self._read(followed, sink)
            else:
                followed.path = path
                self.state[key]["path"] = path
        for key in [k for k in self._open if k not in matched]:
            self._open.pop(key).handle.close()
            self.state.pop(key, None)
        for key in [k for k in self.state if k not in matched and k not in self._open]:
            del self.state[key]
        return consumed

    def _start(self, key: str, path: str) -> _Followed | None:
        try:
            handle = open(path, "rb")  # noqa: SIM115 - kept open to follow across renames
        except OSError as exc:
            self.on_error(path, exc)
            return None
        entry = self.state.get(key)
        offset = entry["offset"] if entry and key in self._known_at_start else 0
        source = source_for(path, key, self.default_job, self.kernel)
        followed = _Followed(handle=handle, path=path, offset=offset, source=source)
        self._open[key] = followed
        self.on_open(source)
        self.state[key] = {"offset": offset, "path": path}
        return followed

    def _read(self, followed: _Followed, sink: Callable[[Source, str], None]) -> int:
        consumed = 0
        try:
            if os.fstat(followed.handle.fileno()).st_size < followed.offset:
                followed.offset = 0  # truncated in place (copytruncate)
            followed.handle.seek(followed.offset)
            while True:
                data = followed.handle.read(_MAX_READ)
                if not data:
                    break
                last = data.rfind(b"\n")
                if last < 0:
                    if len(data) < _MAX_READ:
                        break  # a partial line: wait for its end
                    last = len(data) - 1  # an absurdly long line: take it as it is
                chunk = data[:last + 1]
                sink(followed.source, chunk.decode("utf-8", "replace"))
                followed.offset += len(chunk)
                consumed += len(chunk)
                if last + 1 < len(data):
                    followed.handle.seek(followed.offset)
        except OSError as exc:
            self.on_error(followed.path, exc)
        self.state[followed.source.name] = {"offset": followed.offset, "path": followed.path}
        return consumed

    def close(self) -> None:
        for followed in self._open.values():
            followed.handle.close()
        self._open.clear()
