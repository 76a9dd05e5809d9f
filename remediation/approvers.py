"""Approver credentials: approving a destructive action is its own privilege.

The approvers file names each approver with a SHA-256 digest of their bearer token, one a line:

    # name      digest of the token
    alice       sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08

Only digests are stored, so the file (and its backups) cannot be used to approve. SHA-256
rather than a slow hash (scrypt) because the tokens are 256-bit random strings made by
`python -m trainwatch.remediation.approvers add`, never passwords a person chose: there is no
dictionary
to try, and every request is verified without a deliberate 50 ms delay. The identity recorded
in the audit is the name bound to the token, never a header the caller sets. The webhook token
is not an approver token (checked at load and per request), so whoever can post alerts cannot
also approve what they caused.

    python -m trainwatch.remediation.approvers add NAME --file APPROVERS   # prints the new token
    once
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import os
import re
import secrets
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from trainwatch.exporters.contract.atomic_file import atomic_write

log = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")


class ApproverError(ValueError):
    """An approvers file that cannot be used; the message names the file and line."""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Approvers:
    """(digest, name) pairs; `identify` answers the name bound to a token, or None."""

    entries: tuple[tuple[str, str], ...] = ()

    def identify(self, token: str) -> str | None:
        supplied = digest(token)
        found = None
        for known, name in self.entries:  # compare with every entry: no early exit
            if hmac.compare_digest(supplied, known):
                found = name
        return found


def load_approvers(path: Path, *, webhook_token: str = "") -> Approvers:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ApproverError(f"{path}: cannot read: {exc.strerror}") from exc
    entries: list[tuple[str, str]] = []
    names: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not NAME.match(parts[0]) or not DIGEST.match(parts[1]):
            raise ApproverError(f"{path}:{number}: expected 'NAME sha256:<64 hex digits>'")
        if parts[0] in names:
            raise ApproverError(f"{path}:{number}: approver {parts[0]!r} named twice")
        names.add(parts[0])
        entries.append((DIGEST.match(parts[1]).group(1), parts[0]))  # type: ignore[union-attr]
    approvers = Approvers(tuple(entries))
    if webhook_token and approvers.identify(webhook_token):
        raise ApproverError(f"{path}: an approver's token is the webhook token; approval "
                            "must be a separate credential")
    return approvers


def add(path: Path, name: str) -> str:
    """Append a new approver with a fresh random token; returns the token (shown once)."""
    if not NAME.match(name):
        raise ApproverError(f"approver name must match {NAME.pattern}")
    if path.exists() and name in {line.split()[0] for line in path.read_text().splitlines()
                                  if line.strip() and not line.lstrip().startswith("#")}:
        raise ApproverError(f"{path}: approver {name!r} exists already")
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as fh:
        fh.write(f"{name} sha256:{digest(token)}\n")
    return token


def names(path: Path) -> list[str]:
    """The approvers' names in file order (never their digests); the file must be valid."""
    return [name for _, name in load_approvers(path).entries]


def revoke(path: Path, name: str) -> None:
    """Remove `name`'s line, atomically (the file keeps mode 0600 and its comments). The
    service re-reads the file when it changes (ApproverFile), so the token stops working at
    the next request, without a restart."""
    if name not in names(path):  # also validates the whole file before rewriting it
        raise ApproverError(f"{path}: no approver {name!r}")
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if line.split("#", 1)[0].split()[:1] != [name]]
    atomic_write(path, lambda fh: fh.write("".join(kept).encode()))


class ApproverFile:
    """The approvers file as the service sees it: re-read whenever it changes (inode, size or
    mtime), so `trainwatch approvers revoke` takes effect at the next request. A file that
    turns unreadable or invalid identifies nobody until it is fixed (fail closed), and says so
    in the log once per change."""

    def __init__(self, path: Path, initial: Approvers, *, webhook_token: str = "") -> None:
        self.path = path
        self.webhook_token = webhook_token
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._current = initial

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def current(self) -> Approvers:
        stamp = self._stat()
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._current = load_approvers(self.path, webhook_token=self.webhook_token)
                except ApproverError as exc:
                    log.error("approvers file unusable, no approver accepted until fixed: %s",
                              exc)
                    self._current = Approvers()
            return self._current


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainwatch.remediation.approvers",
                                     description="Manage remediation approver credentials.")
    sub = parser.add_subparsers(dest="command", required=True)
    new = sub.add_parser("add", help="add an approver; prints their token once")
    new.add_argument("name")
    new.add_argument("--file", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        token = add(args.file, args.name)
    except (ApproverError, OSError) as exc:
        print(f"trainwatch.remediation.approvers: {exc}", file=sys.stderr)
        return 2
    print(token)
    return 0


if __name__ == "__main__":
    sys.exit(main())
