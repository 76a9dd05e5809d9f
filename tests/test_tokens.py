"""trainwatch.exporters.contract.tokens: the one reader of secret files and the one bearer check."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from trainwatch.exporters.contract.tokens import (
    MIN_TOKEN_LENGTH,
    SecretFileError,
    bearer,
    read_secret_file,
    read_token_file,
    token_matches,
)

TOKEN = "t" * MIN_TOKEN_LENGTH


def _file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "secret"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_reads_the_token_without_surrounding_whitespace(tmp_path: Path) -> None:
    assert read_token_file(_file(tmp_path, f"  {TOKEN}\n")) == TOKEN


@pytest.mark.parametrize(("text", "mode", "reason"), [
    ("", 0o600, "is empty"),
    ("\n \n", 0o600, "is empty"),
    ("short", 0o600, f"at least {MIN_TOKEN_LENGTH} characters"),
    (TOKEN, 0o602, "writable by other users"),
    (TOKEN, 0o666, "writable by other users"),
])
def test_refuses_unusable_token_files(tmp_path: Path, text: str, mode: int,
                                      reason: str) -> None:
    path = _file(tmp_path, text, mode)
    with pytest.raises(SecretFileError, match=reason) as info:
        read_token_file(path)
    assert str(path) in str(info.value)
    assert TOKEN not in str(info.value)  # the message never carries the secret


def test_refuses_what_is_not_a_regular_file_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)  # opening it to read would block until a writer comes
    with pytest.raises(SecretFileError, match="not a regular file"):
        read_secret_file(fifo)
    with pytest.raises(SecretFileError, match="not a regular file"):
        read_secret_file(tmp_path)
    with pytest.raises(SecretFileError, match="cannot read"):
        read_secret_file(tmp_path / "missing")


def test_refuses_a_huge_file(tmp_path: Path) -> None:
    with pytest.raises(SecretFileError, match="larger than"):
        read_secret_file(_file(tmp_path, "x" * (1 << 20)))


def test_world_readable_is_read_but_logged(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="trainwatch.tokens"):
        assert read_token_file(_file(tmp_path, TOKEN, 0o644)) == TOKEN
    assert "readable by every user" in caplog.text and TOKEN not in caplog.text


def test_a_password_may_be_short(tmp_path: Path) -> None:
    assert read_secret_file(_file(tmp_path, "pw")) == "pw"


@pytest.mark.parametrize(("header", "expected"), [
    (f"Bearer {TOKEN}", TOKEN),
    (f"bearer  {TOKEN} ", TOKEN),
    (f"BEARER {TOKEN}", TOKEN),
    ("Bearer ", None),
    ("Bearer", None),
    (f"Basic {TOKEN}", None),
    (TOKEN, None),
    ("", None),
    (None, None),
])
def test_bearer_header(header: str | None, expected: str | None) -> None:
    assert bearer(header) == expected


def test_token_matches_fails_closed() -> None:
    assert token_matches(TOKEN, TOKEN)
    assert not token_matches(TOKEN + "x", TOKEN)
    assert not token_matches("", TOKEN)
    assert not token_matches(None, TOKEN)
    assert not token_matches(TOKEN, None)  # no token configured: nobody gets in
    assert not token_matches(TOKEN, "")
    assert not token_matches("\udcff" + TOKEN, TOKEN)  # not encodable: no exception
