"""XID errors from the NVML event API, on a thread of its own.

nvmlEventSetWait blocks (up to `wait_ms`) inside the driver, so it cannot share the collection
thread. Each XID event increments a real counter keyed by GPU and XID code: a repeated error
shows as a rising counter (rate() sees it), and the count never resets while the exporter
runs. A watcher that fails stops itself; the collection loop starts a new one later.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import pynvml

from trainwatch.exporters.node.gpu.reader import error_name, text
from trainwatch.exporters.node.gpu.snapshot import GpuIdentity, Tally

log = logging.getLogger(__name__)


class XidWatcher:
    """Registers every GPU for XID events and counts them into `counts[(identity, xid)]`."""

    def __init__(self, nvml: Any, counts: Tally, errors: Tally,
                 identities: dict[int, GpuIdentity], wait_ms: int = 500,
                 on_xid: Callable[[GpuIdentity, int], None] | None = None) -> None:
        self.nvml = nvml
        self.on_xid = on_xid  # told of every XID the moment it is read (fast alerts)
        self.counts = counts
        self.errors = errors
        self.wait_ms = wait_ms
        self._by_uuid = {ident.uuid: ident for ident in identities.values() if ident.uuid}
        self._stop = threading.Event()
        self.registered = 0
        self.running = False
        self.failed = False
        self._thread = threading.Thread(target=self._run, name="gpu-xid-watch", daemon=True)

    def start(self) -> None:
        self.running = True
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            event_set = self.nvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self._fail("nvmlEventSetCreate", exc)
            return
        try:
            self._register(event_set)
            if not self.registered:
                log.info("no GPU supports XID events; XID watch off")
                return
            self._wait_loop(event_set)
        finally:
            self.running = False
            with contextlib.suppress(pynvml.NVMLError):
                self.nvml.nvmlEventSetFree(event_set)

    def _register(self, event_set: Any) -> None:
        try:
            count = self.nvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:  # a driver reload: report the watch as failed, not idle
            self._fail("nvmlDeviceGetCount", exc)
            return
        for index in range(count):
            try:
                handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
                self.nvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                self.registered += 1
            except pynvml.NVMLError_NotSupported:
                continue
            except pynvml.NVMLError as exc:
                self.errors.inc(("nvmlDeviceRegisterEvents", error_name(exc)))

    def _wait_loop(self, event_set: Any) -> None:
        while not self._stop.is_set():
            try:
                data = self.nvml.nvmlEventSetWait(event_set, self.wait_ms)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as exc:
                self._fail("nvmlEventSetWait", exc)
                return
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                identity, xid = self._identify(data.device), int(data.eventData)
                self.counts.inc((identity, str(xid)))
                if self.on_xid is not None:
                    try:
                        self.on_xid(identity, xid)
                    except Exception:  # a failed fast alert must not end the XID watch
                        log.exception("fast alert for XID %d failed", xid)

    def _identify(self, handle: Any) -> GpuIdentity:
        try:
            uuid = text(self.nvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError:
            uuid = ""
        return self._by_uuid.get(uuid, GpuIdentity(-1, uuid, ""))

    def _fail(self, call: str, exc: BaseException) -> None:
        self.failed = True
        self.errors.inc((call, error_name(exc)))
        log.warning("XID watch stopped: %s failed: %s", call, error_name(exc))
