"""Crash-safe file replacement, shared by every part that rewrites a file in place.

Checkpoints and their manifest, the log scanner's offsets, the power-limit tool's saved limits
and the disk-cleanup tool's manifest rewrite all need the same guarantee: after a crash or a
`kill -9` at any instant, the path holds either the old content or the new, never half of one.
So: write a temporary file in the same directory (same filesystem, so the rename is atomic),
fsync it, rename it over the target, then fsync the directory so the rename itself is durable.
The temporary file is created mode 0600, so nothing is ever briefly world-readable.

A rewrite keeps the file what it was to its other users: when the target exists as a regular
file, the replacement gets its owner, group and permission bits before the rename. Without
that a tool running as root (the disk cleanup) left a training job's manifest owned by root,
mode 0600, and the job could no longer read its own checkpoints. When the owner cannot be kept
(an unprivileged writer replacing another user's file) the rewrite is refused with
PermissionError and the old file stays: a silent change of owner is the bug, not a fallback.

Everything happens relative to one open handle on the directory (`dir_fd`), so the temporary
file, the metadata read and the rename all land in the same directory even if a path
component is swapped meanwhile; a caller that walked to that directory safely (the disk
cleanup, component by component with O_NOFOLLOW) passes its handle and a bare name.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(directory: Path) -> int:
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _existing(name: str, dir_fd: int) -> os.stat_result | None:
    """The metadata of the regular file being replaced, if there is one."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _keep_metadata(fd: int, old: os.stat_result, name: str) -> None:
    """Give the new file the old one's owner, group and mode (chown first: it may clear
    set-id bits that the chmod then puts back)."""
    new = os.fstat(fd)
    if (new.st_uid, new.st_gid) != (old.st_uid, old.st_gid):
        try:
            os.fchown(fd, old.st_uid, old.st_gid)
        except PermissionError as exc:
            raise PermissionError(
                exc.errno, f"cannot keep owner {old.st_uid}:{old.st_gid} of {name!r} "
                f"(writing as {new.st_uid}:{new.st_gid}); the file is left unchanged") from None
    os.fchmod(fd, stat.S_IMODE(old.st_mode))


def atomic_write(path: Path, write: Callable[[IO[bytes]], object], *,
                 dir_fd: int | None = None, durable: bool = True) -> None:
    """Replace `path` with what `write(fileobj)` writes; all or nothing, owner and mode kept.

    With `dir_fd`, `path` is a bare file name inside that open directory. `durable=False`
    skips both fsyncs: still all or nothing for every reader, but a power cut may keep the old
    content (for a record rewritten several times a second, where an fsync each time would
    cost the shared filesystem more than losing one rewrite)."""
    path = Path(path)
    if dir_fd is not None and (path.name != str(path) or path.name in ("", ".", "..")):
        raise ValueError(f"with dir_fd, {path!s} must be a bare file name")
    directory = _open_dir(path.parent) if dir_fd is None else os.dup(dir_fd)
    try:
        name = path.name
        old = _existing(name, directory)
        for _ in range(100):
            tmp = f".{name}.{secrets.token_hex(6)}.tmp"
            try:
                fd = os.open(tmp, _TMP_FLAGS, 0o600, dir_fd=directory)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free temporary name for {name!r}")
        try:
            with os.fdopen(fd, "wb") as handle:
                if old is not None:
                    _keep_metadata(handle.fileno(), old, name)
                write(handle)
                handle.flush()
                if durable:
                    os.fsync(handle.fileno())
            os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=directory)
            raise
        if durable:
            os.fsync(directory)
    finally:
        os.close(directory)


def atomic_write_json(path: Path, document: Any, *, dir_fd: int | None = None,
                      durable: bool = True, **dumps_options: Any) -> None:
    """Replace `path` with `document` as JSON; all or nothing, owner and mode kept."""
    data = json.dumps(document, **dumps_options).encode()
    atomic_write(path, lambda handle: handle.write(data), dir_fd=dir_fd, durable=durable)
