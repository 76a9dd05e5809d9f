"""The background collection loop: init with backoff, one cycle per interval, staleness.

All NVML calls happen on this loop's thread (and the XID thread), never on a scrape. A
hung NVML call blocks only this thread: no new cycle starts while one is running, so threads
never pile up, and scrapes keep serving the last complete snapshot, reported stale once the
cycle in progress has run past its deadline.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from trainwatch.exporters.node.gpu.processes import ProcessAttributor
from trainwatch.exporters.node.gpu.reader import (
    DeviceReader,
    NvmlGone,
    cuda_version_text,
    error_name,
    text,
)
from trainwatch.exporters.node.gpu.snapshot import GpuIdentity, Snapshot, Tally
from trainwatch.exporters.node.gpu.xid import XidWatcher

log = logging.getLogger(__name__)

MAX_INIT_BACKOFF = 60.0
XID_RESTART_AFTER = 30.0


class CollectionLoop:
    """Owns the NVML session. `snapshot` is the last complete cycle (None before the first)."""

    def __init__(self, nvml: Any, *, interval: float, deadline: float | None = None,
                 attributor: ProcessAttributor | None = None, watch_xid: bool = True,
                 read_nvlink: bool = True, read_gpm: bool = True,
                 on_xid: Callable[[GpuIdentity, int], None] | None = None) -> None:
        self.nvml = nvml
        self.on_xid = on_xid
        self.interval = interval
        self.deadline = deadline if deadline is not None else interval
        self.watch_xid = watch_xid
        self.errors = Tally()  # (call, error) -> count
        self.collections = Tally()  # result -> count
        self.xid_counts = Tally()  # (GpuIdentity, xid) -> count
        self.reader = DeviceReader(nvml, self.errors, attributor, read_nvlink=read_nvlink,
                                   read_gpm=read_gpm)
        self.snapshot: Snapshot | None = None
        self.cycle_started: float | None = None  # monotonic; set while a cycle runs
        self.xid_watcher: XidWatcher | None = None
        self._initialised = False
        self._backoff = interval
        self._next_init = 0.0
        self._last_success: float | None = None
        self._driver: tuple[str | None, str | None] = (None, None)
        self._xid_started = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-collect", daemon=True)

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop without waiting on a hung NVML call for longer than `timeout`."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self.xid_watcher is not None:
            self.xid_watcher.stop(timeout)
        if self._initialised and not self._thread.is_alive():
            self._free_gpm()
            with contextlib.suppress(pynvml.NVMLError):
                self.nvml.nvmlShutdown()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.run_once()
            elapsed = time.monotonic() - started
            # Never back-to-back: a slow NVML gets at least a tenth of an interval of rest.
            self._stop.wait(max(self.interval - elapsed, self.interval / 10))

    # --- staleness (read by scrapes) --------------------------------------------------------
    def is_stale(self, now_monotonic: float | None = None) -> bool:
        now = time.monotonic() if now_monotonic is None else now_monotonic
        started = self.cycle_started
        if started is not None and now - started > self.deadline:
            return True
        snap = self.snapshot
        return snap is None or now - snap.taken_monotonic > self.interval + self.deadline

    # --- one cycle --------------------------------------------------------------------------
    def run_once(self) -> Snapshot:
        started = time.monotonic()
        self.cycle_started = started
        try:
            snapshot = self._cycle(started)
        finally:
            self.cycle_started = None
        self.snapshot = snapshot
        return snapshot

    def _cycle(self, started: float) -> Snapshot:
        if not self._ensure_init(started):
            self.collections.inc("nvml_down")
            return self._snapshot(started, nvml_up=False, gpus=self.reader.known_down())
        try:
            gpus = self.reader.read_all()
        except NvmlGone as exc:
            log.warning("NVML stopped answering (%s); re-initialising", exc)
            self._lose_session(started)
            self.collections.inc("nvml_down")
            return self._snapshot(started, nvml_up=False, gpus=self.reader.known_down())
        self._maybe_start_xid()
        duration = time.monotonic() - started
        self.collections.inc("overrun" if duration > self.deadline else "success")
        self._last_success = time.time()
        return self._snapshot(started, nvml_up=True, gpus=gpus)

    def _snapshot(self, started: float, *, nvml_up: bool, gpus: tuple) -> Snapshot:
        finished = time.monotonic()
        return Snapshot(taken_at=time.time(), taken_monotonic=finished,
                        duration=finished - started, nvml_up=nvml_up,
                        driver_version=self._driver[0], cuda_version=self._driver[1],
                        gpus=gpus, last_success=self._last_success,
                        gpm_duration=(self.reader.gpm.cycle_seconds
                                      if self.reader.gpm is not None and nvml_up else None))

    def _ensure_init(self, now: float) -> bool:
        if self._initialised:
            return True
        if now < self._next_init:
            return False
        try:
            self.nvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.errors.inc(("nvmlInit", error_name(exc)))
            self._next_init = now + self._backoff
            log.warning("NVML init failed (%s); retrying in %.1fs", error_name(exc), self._backoff)
            self._backoff = min(self._backoff * 2, MAX_INIT_BACKOFF)
            return False
        self._initialised = True
        self._backoff = self.interval
        self.reader.identities.clear()
        self.reader.memory_v2 = True  # the driver may have changed while NVML was away
        driver = self.reader.call("nvmlSystemGetDriverVersion")
        cuda = self.reader.call("nvmlSystemGetCudaDriverVersion")
        self._driver = (text(driver) if driver else None,
                        cuda_version_text(int(cuda)) if cuda else None)
        log.info("NVML initialised: driver %s, CUDA %s", *self._driver)
        return True

    def _lose_session(self, now: float) -> None:
        self._initialised = False
        self._next_init = now + self._backoff
        if self.xid_watcher is not None:
            self.xid_watcher.stop(timeout=0.1)
            self.xid_watcher = None
        self._free_gpm()
        with contextlib.suppress(pynvml.NVMLError):
            self.nvml.nvmlShutdown()

    def _free_gpm(self) -> None:
        """GPM sample buffers belong to this NVML session: free them before it ends."""
        if self.reader.gpm is not None:
            self.reader.gpm.reset()

    def _maybe_start_xid(self) -> None:
        if not self.watch_xid:
            return
        watcher = self.xid_watcher
        if watcher is not None and (watcher.is_alive() or not watcher.failed):
            return  # running, or finished because no GPU supports events
        now = time.monotonic()
        if watcher is not None and now - self._xid_started < XID_RESTART_AFTER:
            return
        self._xid_started = now
        self.xid_watcher = XidWatcher(self.nvml, self.xid_counts, self.errors,
                                      dict(self.reader.identities), on_xid=self.on_xid)
        self.xid_watcher.start()

    def xid_watch_up(self) -> bool:
        watcher = self.xid_watcher
        return watcher is not None and watcher.is_alive() and watcher.registered > 0
