"""Pages to the on-call (config pager_url), sent off the workers' path.

A page is queued and sent by one background thread, each POST with one deadline for the whole
call (trainwatch.remediation.outgoing), so a slow or stuck pager delays neither the intent that
paged nor any other. A page that cannot be sent is logged; its content is in the audit record
of the decision that paged, so nothing is only in the page.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainwatch.remediation.outgoing import CallFailed, call

log = logging.getLogger(__name__)
MAX_QUEUED = 1000  # pages waiting to be sent; past it a page is logged and dropped


@dataclass(frozen=True)
class Page:
    """One message to the on-call."""

    event: str
    intent_id: int | None
    alertname: str
    summary: str
    detail: Mapping[str, Any] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {"event": self.event, "intent_id": self.intent_id, "alertname": self.alertname,
                "summary": self.summary, **self.detail}


class Pager:
    """Queue pages; one daemon thread sends them, started with the first page."""

    def __init__(self, url: str | None, deadline_seconds: float) -> None:
        self.url = url
        self.deadline_seconds = deadline_seconds
        self._queue: queue.Queue[Page | None] = queue.Queue(MAX_QUEUED)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.failed = 0

    def send(self, page: Page) -> None:
        """Queue `page` and return at once."""
        if not self.url:
            log.warning("%s for intent %s: no pager_url to page", page.event, page.intent_id)
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="remediation-pager",
                                                daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(page)
        except queue.Full:
            self.failed += 1
            log.error("pager queue full: %s for intent %s not sent (see the audit)",
                      page.event, page.intent_id)

    def idle(self) -> bool:
        """Whether every queued page has been sent or given up (for tests and shutdown)."""
        return self._queue.unfinished_tasks == 0

    def stop(self, timeout: float = 5.0) -> None:
        with self._lock:
            thread = self._thread
        if thread is not None and thread.is_alive():
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                return
            thread.join(timeout)

    def _loop(self) -> None:
        while True:
            page = self._queue.get()
            try:
                if page is None:
                    return
                self._post(page)
            finally:
                self._queue.task_done()

    def _post(self, page: Page) -> None:
        assert self.url is not None
        try:
            answer = call("POST", self.url, json_body=page.body(),
                          deadline_seconds=self.deadline_seconds)
        except CallFailed as exc:
            self.failed += 1
            log.warning("paging %s for intent %s failed: %s", page.event, page.intent_id, exc)
            return
        if answer.status >= 300:
            self.failed += 1
            log.warning("paging %s for intent %s: the pager answered %d", page.event,
                        page.intent_id, answer.status)
            return
        self.sent += 1
