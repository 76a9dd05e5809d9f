"""Discrete hard events, straight to Alertmanager the moment an exporter sees them.

A fatal XID is an event no noise produces, and the job it kills is dead from that moment: the
rule path (scrape interval + evaluation interval + the rule's `for:` + `group_wait`) costs the
production profile about two minutes before remediation hears of it. So the exporter that sees
the event (the GPU exporter's NVML event thread) also posts it to Alertmanager's v2 API at
once, with the label LABEL_FAST (the contract's catalog); the Alertmanager configuration
(alert_rules/alertmanager.yml.j2) routes those to the remediation webhook only, with
`group_wait: 0s`, and to nobody else: people are paged by the rules' own alerts, with their
`for:` and grouping, exactly as before. The alert carries the rule's name and labels
(alertname, node, gpu, uuid, xid), so the same playbooks match it and the remediation
service's rails absorb the rule's alert that follows (the node's drain still holds; or, once a
person returned the node, the rule's alert began within `rule_alert_lag` of the fast alert's
drain: `already_healed`).

Posting never blocks the caller: events go to a bounded queue drained by a thread of its own,
each POST with one deadline; a full queue or an Alertmanager that does not answer drops the
fast copy (counted), and the rule's alert still follows.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import queue
import re
import stat
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trainwatch.exporters.contract.catalog import (
    FAST_ALERT_DROPPED,
    FAST_ALERT_SENT,
    LABEL_EVENT,
    LABEL_FAST,
)

log = logging.getLogger(__name__)

QUEUE_SIZE = 256
# The fast alerts' `node` label: the host name Prometheus gives the node's targets
# (inventory_hostname_short), which the remediation inventory is keyed by.
NODE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,62}")
USERNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")


def check_url(url: str) -> str:
    """An Alertmanager base URL (http or https, a host, no query or credentials)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.username or parts.password:
        raise ValueError(f"alertmanager URL {url!r}: http(s)://host[:port][/path] only")
    return url.rstrip("/")


def add_arguments(parser: argparse.ArgumentParser, *, what: str, node: bool = True) -> None:
    """The exporters' fast-alert flags: `--alertmanager-url` (repeatable), the basic-auth
    credential an Alertmanager outside loopback requires (the password from a file, never an
    argument) and, unless the exporter has its own, `--node`. `what` says which events are
    posted (the help text)."""
    parser.add_argument("--alertmanager-url", dest="alertmanager_urls", action="append",
                        metavar="URL", help=f"post {what} to this Alertmanager at once "
                        "(repeatable; needs --node)")
    parser.add_argument("--alertmanager-username", metavar="USER",
                        help="basic-auth user for the Alertmanagers (with "
                        "--alertmanager-password-file)")
    parser.add_argument("--alertmanager-password-file", type=Path, metavar="FILE",
                        help="file holding that user's password (not world-readable)")
    if node:
        parser.add_argument("--node", help="this node's inventory host name, the fast "
                            "alerts' `node` label")


def check_settings(urls: Sequence[str] | None, node: str | None) -> tuple[str, ...]:
    """The Alertmanager URLs, checked together with the node they name (ValueError, with
    the flag to fix, when they do not fit): no URL means fast alerts are off."""
    urls = tuple(urls or ())
    if urls and not node:
        raise ValueError("alertmanager_urls (--alertmanager-url) needs node (--node): the "
                         "fast alerts name the node")
    if urls and node is not None and not NODE_NAME.fullmatch(node):
        raise ValueError(f"node {node!r}: a plain host name only")
    return tuple(check_url(url) for url in urls)


def read_credential(username: str | None, password_file: Path | None) -> Credential | None:
    """The basic-auth credential for the Alertmanagers: both parts or neither (ValueError).
    The password file must not be readable by everyone (the credential lets its holder post
    alerts that act), and holds one line."""
    if username is None and password_file is None:
        return None
    if not username or password_file is None:
        raise ValueError("alertmanager_username and alertmanager_password_file go together")
    if not USERNAME.fullmatch(username):
        raise ValueError(f"alertmanager username {username!r}: letters, digits, . _ - only")
    try:
        mode = password_file.stat().st_mode
        text = password_file.read_text()
    except OSError as exc:
        raise ValueError(f"alertmanager password file {password_file}: {exc.strerror}") from None
    if mode & stat.S_IROTH:
        raise ValueError(f"alertmanager password file {password_file} is world-readable: "
                         "chmod o-r it")
    password = text.rstrip("\n")
    if not password or "\n" in password:
        raise ValueError(f"alertmanager password file {password_file}: one non-empty line")
    return Credential(username, password)


@dataclass(frozen=True)
class Credential:
    """Basic auth for the Alertmanagers; repr hides the password (it may reach a log)."""

    username: str
    password: str = field(repr=False)

    def header(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")


class FastAlerts:
    """Posts alerts to every configured Alertmanager from a background thread."""

    def __init__(self, urls: Sequence[str], *, credential: Credential | None = None,
                 hold_seconds: float = 600.0, timeout_seconds: float = 2.0) -> None:
        self.urls = [check_url(u) for u in urls]
        self._credential = credential
        self.hold_seconds = hold_seconds
        self.timeout_seconds = timeout_seconds
        self.sent = 0
        self.dropped = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_SIZE)
        self._thread = threading.Thread(target=self._run, name="fast-alerts", daemon=True)
        self._thread.start()

    def post(self, alertname: str, labels: Mapping[str, str], summary: str) -> None:
        """Queue one alert (never blocks: a full queue drops it, counted)."""
        now = datetime.now(timezone.utc)
        event = str(int(now.timestamp() * 1000))
        # LABEL_EVENT makes each event an alert of its own: Alertmanager merges a post whose
        # labels equal an alert it still holds (for hold_seconds) into that alert and notifies
        # nobody again, so a second XID of the same code on the same GPU, or the same rank
        # killed again, within ten minutes of the first never reached the webhook.
        alert = {"labels": {**labels, "alertname": alertname, LABEL_FAST: "true",
                            LABEL_EVENT: event},
                 "annotations": {"summary": summary},
                 "startsAt": now.isoformat(),
                 "endsAt": (now + timedelta(seconds=self.hold_seconds)).isoformat()}
        try:
            self._queue.put_nowait(alert)
        except queue.Full:
            self.dropped += 1

    def outcomes(self) -> tuple[tuple[str, int], ...]:
        """(outcome label, count) for the exporters' fast-alert counter."""
        return ((FAST_ALERT_SENT, self.sent), (FAST_ALERT_DROPPED, self.dropped))

    def close(self, timeout: float = 2.0) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            alert = self._queue.get()
            if alert is None:
                return
            body = json.dumps([alert]).encode()
            for url in self.urls:
                self._send(url, body)

    def _send(self, url: str, body: bytes) -> None:
        # lazy: urllib.request loads http.client, email and ssl, which the exporter's serving
        # path keeps out of its RSS unless fast alerts are on
        import urllib.error
        import urllib.request

        headers = {"Content-Type": "application/json"}
        if self._credential is not None:
            headers["Authorization"] = self._credential.header()
        request = urllib.request.Request(  # noqa: S310 - scheme checked in check_url
            f"{url}/api/v2/alerts", data=body, method="POST", headers=headers)
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_seconds) as resp:  # noqa: S310
                resp.read(1024)
            self.sent += 1
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.dropped += 1
            log.warning("fast alert to %s failed after %.1fs: %s", url,
                        time.monotonic() - started, exc)
