"""Secrets read from files, and the bearer-token check every Trainwatch endpoint uses.

One module so that every service reads a token file the same way (whole file, surrounding
whitespace dropped, bounded size, a regular file, not writable by other users) and compares a
presented token the same way (constant time on bytes, whatever the presented length or
content). Callers turn `SecretFileError` into their own message (a config error, an exit, a
warning); its text names the file but never the secret.

Kept dependency-free (stdlib only): the training client imports it on every rank.
"""

from __future__ import annotations

import hmac
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("trainwatch.tokens")

# Bearer tokens are made by `secrets` (Ansible: 48 characters; tests: 32+); anything shorter
# than this was typed by hand and is refused where a token guards an action.
MIN_TOKEN_LENGTH = 16
# A secret file larger than this is not a secret file (a wrong path, a log): refuse it
# instead of reading it whole.
MAX_SECRET_BYTES = 64 * 1024


class SecretFileError(ValueError):
    """A secret file that cannot be used; the message names the file, never its content."""


def read_secret_file(path: Path, *, min_length: int = 1) -> str:
    """The file's text without surrounding whitespace.

    Refused (SecretFileError): unreadable, not a regular file (a FIFO would block the reader),
    larger than MAX_SECRET_BYTES, writable by other users (anyone could replace the
    credential), empty or shorter than `min_length`. Readable by other users is allowed but
    logged: secrets belong in files of mode 0600 or 0640.
    """
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise SecretFileError(f"{path} is not a regular file")
        if info.st_size > MAX_SECRET_BYTES:
            raise SecretFileError(f"{path} is larger than {MAX_SECRET_BYTES} bytes")
        if info.st_mode & stat.S_IWOTH:
            raise SecretFileError(f"{path} is writable by other users; use mode 0600 or 0640")
        with open(path, "rb") as handle:
            raw = handle.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise SecretFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        value = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise SecretFileError(f"{path} is not UTF-8 text") from None
    if not value:
        raise SecretFileError(f"{path} is empty")
    if len(value) < min_length:
        raise SecretFileError(f"{path}: the secret must be at least {min_length} characters")
    if info.st_mode & stat.S_IROTH:
        log.warning("%s is readable by every user; use mode 0600 or 0640", path)
    return value


def read_token_file(path: Path) -> str:
    """A bearer token from its file (read_secret_file with the token's minimum length)."""
    return read_secret_file(path, min_length=MIN_TOKEN_LENGTH)


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, else None."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def token_matches(presented: str | None, expected: str | None) -> bool:
    """Whether the presented token is the expected one, in constant time on bytes of both
    (hmac.compare_digest), whatever the presented length or content. False when either is
    missing: a service with no token configured accepts nobody (fail closed)."""
    if not presented or not expected:
        return False
    return hmac.compare_digest(presented.encode("utf-8", "replace"),
                               expected.encode("utf-8", "replace"))
