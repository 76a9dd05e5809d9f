"""Append JSON lines to one file and rotate it by size the way log shippers expect.

Rotation renames `rank-0.jsonl` to `rank-0.jsonl.1` (older ones shift to `.2` ... up to
`backup_count`) and opens a fresh `rank-0.jsonl`, exactly like the stdlib
RotatingFileHandler. A shipper that follows by inode (Filebeat, our own scanner) finishes the
renamed file and picks up the new one; nothing is ever truncated or copied.
"""

from __future__ import annotations

import os
from pathlib import Path

# The most buffers one writev call takes (POSIX guarantees at least 16; Linux takes 1024).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 16


class RotatingJsonlWriter:
    """Writes whole lines; a file is rotated before a line would push it past `max_bytes`."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int = 100 * 1024 * 1024,
                 backup_count: int = 5) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0 (0 disables rotation)")
        if backup_count < 0:
            raise ValueError("backup_count must be >= 0")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backup_count = backup_count
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Unbuffered: lines arrive in batches already, and a forked child must not inherit a
        # half-full buffer that it would write a second time.
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - owned until close()
        self._size = self._file.tell()
        self.rotations = 0

    def write_lines(self, lines: list[bytes]) -> None:
        """Append `lines` (each without its newline) with as few write calls as possible."""
        if not lines:
            return
        if self.max_bytes == 0:
            self._append(b"\n".join(lines) + b"\n")
            return
        start = 0
        size = self._size
        for index, line in enumerate(lines):
            needed = len(line) + 1
            if size + needed > self.max_bytes and size > 0:
                if index > start:
                    self._append(b"\n".join(lines[start:index]) + b"\n")
                self._rotate()
                start, size = index, 0
            size += needed
        self._append(b"\n".join(lines[start:]) + b"\n")

    def write_block(self, block: bytes) -> None:
        """Append newline-terminated lines given as one buffer; split only to rotate."""
        if not block:
            return
        if self.max_bytes == 0 or self._size + len(block) <= self.max_bytes:
            self._append(block)
            return
        self.write_lines(block[:-1].split(b"\n"))

    def write_blocks(self, blocks: list[bytes]) -> None:
        """Append several blocks of newline-terminated lines with writev, without joining them.

        Why: joining a writer's worth of blocks (~1 MB) into one buffer costs a copy into fresh
        memory on every write; writev hands the kernel the blocks where they are.
        """
        total = sum(map(len, blocks))
        if not total:
            return
        if self.max_bytes and self._size + total > self.max_bytes:
            for block in blocks:  # rotation splits at a line: block by block
                self.write_block(block)
            return
        fd = self._file.fileno()
        pending = [memoryview(block) for block in blocks if block]
        while pending:
            written = os.writev(fd, pending[:_IOV_MAX])
            while pending and written >= len(pending[0]):
                written -= len(pending.pop(0))
            if written:
                pending[0] = pending[0][written:]
        self._size += total

    def _append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = self._file.write(view)
            view = view[written or 0:]
        self._size += len(data)

    def _rotate(self) -> None:
        self._file.close()
        if self.backup_count > 0:
            for index in range(self.backup_count - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{index}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{index + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115
        self._size = 0
        self.rotations += 1

    def flush(self) -> None:
        """Nothing is buffered in-process; the OS has every byte written so far."""

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
