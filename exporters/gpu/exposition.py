"""The collector that serves the loop's last snapshot as metric families; never calls NVML.

Families for one snapshot are built once and reused by every scrape until the next snapshot
(the snapshot is immutable), so a scrape costs little more than text rendering. Only the
age/staleness, counters and XID families are built per scrape. The families are
exporters.gpu.text_format's (prometheus_client's shape, without importing it: RSS).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from exporters.catalog import GPU_LABELS
from exporters.gpu import metrics as m
from exporters.gpu.collector_loop import CollectionLoop
from exporters.gpu.gpm import GPM_METRICS
from exporters.gpu.snapshot import Snapshot
from exporters.gpu.text_format import Family, counter, gauge

HELP: dict[str, str] = {
    m.UP: "1 if the GPU answered NVML in the last cycle, 0 if it is lost or unreachable.",
    m.INFO: "GPU identity; value 1.",
    m.DRIVER_INFO: "NVIDIA driver and CUDA driver versions; value 1.",
    m.XID_ERRORS: "XID errors reported by the NVML event API since the exporter started.",
    m.UTILIZATION: "Fraction of time a kernel was running on the GPU (0-1).",
    m.MEMORY_UTILIZATION: "Fraction of time device memory was being read or written (0-1).",
    m.MEMORY_USED: "Device memory used, bytes (as nvidia-smi: without the driver's reservation "
                    "where the driver has NVML's v2 memory info).",
    m.MEMORY_FREE: "Device memory free, bytes.",
    m.MEMORY_TOTAL: "Device memory total, bytes.",
    m.MEMORY_RESERVED: "Device memory reserved by the driver and firmware, bytes (v2 memory "
                        "info only).",
    m.TEMPERATURE: "GPU core temperature, degrees Celsius.",
    m.POWER_USAGE: "Power draw, watts.",
    m.POWER_LIMIT: "Enforced power limit, watts.",
    m.POWER_LIMIT_MIN: "Lowest settable power limit, watts.",
    m.POWER_LIMIT_MAX: "Highest settable power limit, watts.",
    m.POWER_LIMIT_DEFAULT: "Default power limit, watts.",
    m.ENERGY: "Energy consumed since the driver was loaded, joules.",
    m.SM_CLOCK: "SM clock, hertz.",
    m.MEMORY_CLOCK: "Memory clock, hertz.",
    m.CLOCK_EVENT_REASON: "1 if this clock event (throttle) reason is active.",
    m.ECC_ERRORS: "ECC errors (volatile: since driver load; aggregate: lifetime).",
    m.REMAPPED_ROWS: "Memory rows remapped, by cause.",
    m.REMAP_PENDING: "1 if a row remap is pending (needs a GPU reset).",
    m.REMAP_FAILURE: "1 if a row remap failed (the GPU should be replaced).",
    m.PCIE_LINK_GENERATION: "Current PCIe link generation.",
    m.PCIE_LINK_WIDTH: "Current PCIe link width (lanes).",
    m.PCIE_REPLAYS: "PCIe replay counter.",
    m.NVLINK_UP: "1 if the NVLink link is active.",
    m.NVLINK_ERRORS: "NVLink data-link error counters.",
    m.PROCESSES: "Compute processes on the GPU.",
    m.PROCESS_MEMORY: "GPU memory used by compute processes, by training job and rank "
                      "(empty labels: not attributable).",
    m.MIG_ENABLED: "1 if MIG mode is enabled.",
    m.MIG_MEMORY_USED: "Memory used on a MIG device, bytes.",
    m.MIG_MEMORY_TOTAL: "Memory of a MIG device, bytes.",
    m.GPM_SUPPORTED: "1 if the profiling metrics (NVML GPM) are read on this GPU; 0: not "
                     "supported, or MIG mode is enabled.",
    **{row.name: row.help for row in GPM_METRICS},
    m.GPM_DURATION: "Time the last collection cycle spent reading NVML GPM, seconds.",
    m.SIMULATED: "1 if the exporter serves a simulated (fake) NVML, 0 on real hardware.",
    m.NVML_UP: "1 if NVML is initialised and answering.",
    m.COLLECTION_DURATION: "Duration of the last completed collection cycle, seconds.",
    m.LAST_SUCCESS: "Unix time of the last cycle that read NVML successfully.",
    m.DATA_AGE: "Age of the data served, seconds.",
    m.STALE: "1 if the data served is stale (a cycle overran its deadline or none ran).",
    m.COLLECTIONS: "Collection cycles by result (success, overrun, nvml_down).",
    m.ERRORS: "NVML call errors by call and error (NotSupported is not an error).",
    m.XID_WATCH_UP: "1 if the XID event watch is running on at least one GPU.",
}
COUNTERS = frozenset({m.XID_ERRORS, m.ENERGY, m.ECC_ERRORS, m.PCIE_REPLAYS, m.NVLINK_ERRORS,
                      m.COLLECTIONS, m.ERRORS})


def _family(name: str, labels: list[str]) -> Family:
    if name in COUNTERS:
        return counter(name.removesuffix("_total"), HELP[name], labels=labels)
    return gauge(name, HELP[name], labels=labels)


def snapshot_families(snapshot: Snapshot) -> list[Family]:
    """Every family a snapshot alone determines, in a stable order (golden-file friendly)."""
    families: dict[str, Family] = {}
    order = {name: i for i, name in enumerate(m.ALL_METRICS)}

    def family(name: str, extra: tuple[str, ...]) -> Family:
        if name not in families:
            families[name] = _family(name, [*GPU_LABELS, *extra])
        return families[name]

    for gpu in snapshot.gpus:
        base = list(gpu.identity.labels())
        family(m.UP, ()).add_metric(base, 1.0 if gpu.up else 0.0)
        for sample in gpu.samples:
            extra = tuple(k for k, _ in sample.labels)
            family(sample.metric, extra).add_metric(
                base + [v for _, v in sample.labels], sample.value)
    out = sorted(families.values(), key=lambda f: order.get(_full_name(f), len(order)))
    out.append(gauge(m.NVML_UP, HELP[m.NVML_UP],
                     value=1.0 if snapshot.nvml_up else 0.0))
    if snapshot.driver_version or snapshot.cuda_version:
        info = gauge(m.DRIVER_INFO, HELP[m.DRIVER_INFO],
                     labels=["driver_version", "cuda_version"])
        info.add_metric([snapshot.driver_version or "", snapshot.cuda_version or ""], 1.0)
        out.append(info)
    out.append(gauge(m.COLLECTION_DURATION, HELP[m.COLLECTION_DURATION],
                     value=snapshot.duration))
    if snapshot.gpm_duration is not None:
        out.append(gauge(m.GPM_DURATION, HELP[m.GPM_DURATION],
                         value=snapshot.gpm_duration))
    if snapshot.last_success is not None:
        out.append(gauge(m.LAST_SUCCESS, HELP[m.LAST_SUCCESS],
                         value=snapshot.last_success))
    return out


def _full_name(family: Family) -> str:
    return family.name + "_total" if family.type == "counter" else family.name


class GpuCollector:
    """Served by exporters.gpu.http_server; reads the loop's published state only (a
    prometheus_client registry can also collect it: same protocol)."""

    def __init__(self, loop: CollectionLoop, simulated: bool) -> None:
        self.loop = loop
        self.simulated = simulated
        self._lock = threading.Lock()
        self._cached: tuple[Snapshot | None, list[Family]] = (None, [])

    def _families_for(self, snapshot: Snapshot) -> list[Family]:
        with self._lock:
            cached_snapshot, families = self._cached
            if cached_snapshot is not snapshot:
                families = snapshot_families(snapshot)
                self._cached = (snapshot, families)
            return families

    def collect(self) -> Iterator[Family]:
        snapshot = self.loop.snapshot
        if snapshot is not None:
            yield from self._families_for(snapshot)
        yield from self.live_families(snapshot)

    def snapshot_part(self) -> tuple[Snapshot | None, list[Family]]:
        """The published snapshot and its (cached) families."""
        snapshot = self.loop.snapshot
        return snapshot, ([] if snapshot is None else self._families_for(snapshot))

    def live_families(self, snapshot: Snapshot | None) -> Iterator[Family]:
        """What changes between snapshots: XID counters, age, staleness, self counters."""
        yield from self._xid_families()
        yield from self._dynamic_families(snapshot)

    def _xid_families(self) -> Iterator[Family]:
        family = counter(m.XID_ERRORS.removesuffix("_total"), HELP[m.XID_ERRORS],
                         labels=[*GPU_LABELS, "xid"])
        for (identity, xid), count in self.loop.xid_counts.items():
            family.add_metric([*identity.labels(), xid], float(count))
        yield family

    def _dynamic_families(self, snapshot: Snapshot | None) -> Iterator[Family]:
        yield gauge(m.SIMULATED, HELP[m.SIMULATED],
                    value=1.0 if self.simulated else 0.0)
        now = time.monotonic()
        if snapshot is not None:
            yield gauge(m.DATA_AGE, HELP[m.DATA_AGE],
                        value=max(now - snapshot.taken_monotonic, 0.0))
        yield gauge(m.STALE, HELP[m.STALE],
                    value=1.0 if self.loop.is_stale(now) else 0.0)
        yield gauge(m.XID_WATCH_UP, HELP[m.XID_WATCH_UP],
                    value=1.0 if self.loop.xid_watch_up() else 0.0)
        collections = counter(m.COLLECTIONS.removesuffix("_total"),
                              HELP[m.COLLECTIONS], labels=["result"])
        for result, count in self.loop.collections.items():
            collections.add_metric([str(result)], float(count))
        yield collections
        errors = counter(m.ERRORS.removesuffix("_total"), HELP[m.ERRORS],
                         labels=["call", "error"])
        for (call, error), count in self.loop.errors.items():
            errors.add_metric([call, error], float(count))
        yield errors

