"""Outgoing HTTP calls with one deadline for the whole call.

`requests`' timeout bounds each socket read, not the call: a server that trickles one byte
at a time keeps a call going for as long as it likes. Here a watchdog shuts the socket down
when the deadline passes, whatever the call is doing then (connecting, sending, reading the
status line, the headers or the body), so a call returns or fails by its deadline.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# The most of an answer's body that is read (the callers need the status, not the body).
MAX_BODY_BYTES = 64 * 1024


class CallFailed(RuntimeError):
    """The call did not complete by its deadline, or could not be made; the message says
    which (never the body or the headers sent)."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


def call(method: str, url: str, *, deadline_seconds: float, json_body: Any = None,
         headers: Mapping[str, str] | None = None) -> Answer:
    """`method url` with an optional JSON body, answered within `deadline_seconds` in all, or
    CallFailed. Only http and https; https verifies the server's certificate."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CallFailed(f"not an http(s) URL: {parts.scheme}://{parts.hostname or ''}")
    if deadline_seconds <= 0:
        raise CallFailed("no time left for the call")
    started = time.monotonic()
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port,
                                           timeout=deadline_seconds,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=deadline_seconds)
    body = None if json_body is None else json.dumps(json_body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})} if body is not None \
        else dict(headers or {})
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(deadline_seconds, cut)
    watchdog.daemon = True
    watchdog.start()
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    try:
        conn.request(method, target, body=body, headers=sent)
        resp = conn.getresponse()
        data = resp.read(MAX_BODY_BYTES)
        if expired.is_set():
            raise CallFailed(f"no answer within {deadline_seconds:g}s")
        return Answer(resp.status, data)
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set() or time.monotonic() - started >= deadline_seconds:
            raise CallFailed(f"no answer within {deadline_seconds:g}s") from exc
        raise CallFailed(type(exc).__name__) from exc
    finally:
        watchdog.cancel()
        conn.close()
