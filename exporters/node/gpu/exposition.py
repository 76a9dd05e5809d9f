"""The collector that serves the loop's last snapshot as metric families; never calls NVML.

Families for one snapshot are built once and reused by every scrape until the next snapshot
(the snapshot is immutable), so a scrape costs little more than text rendering. Only the
age/staleness, counters and XID families are built per scrape. The families are
trainwatch.exporters.node.gpu.text_format's (prometheus_client's shape, without importing it: RSS).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.contract.catalog import GPU_LABELS
from trainwatch.exporters.node.gpu.collector_loop import CollectionLoop
from trainwatch.exporters.node.gpu.snapshot import Snapshot
from trainwatch.exporters.node.gpu.text_format import Family, counter, gauge

# HELP text and type of every family: the GPU rows of the metric table
# (exporters/contract/catalog.py),
# whose order is the order families are served in.
GPU_METRICS = c.metrics_of("gpu")
HELP: dict[str, str] = {row.name: row.help for row in GPU_METRICS}
COUNTERS = frozenset(row.name for row in GPU_METRICS if row.type == c.COUNTER)
# Served only while non-zero (the table's `sparse` rows): the snapshot keeps NVML's zeros, the
# scrape leaves them out, so a healthy fleet's alerts read no error series at all.
SPARSE = frozenset(row.name for row in GPU_METRICS if row.sparse)


def _family(name: str, labels: list[str]) -> Family:
    if name in COUNTERS:
        return counter(name.removesuffix("_total"), HELP[name], labels=labels)
    return gauge(name, HELP[name], labels=labels)


def snapshot_families(snapshot: Snapshot) -> list[Family]:
    """Every family a snapshot alone determines, in a stable order (golden-file friendly)."""
    families: dict[str, Family] = {}
    order = {row.name: i for i, row in enumerate(GPU_METRICS)}

    def family(name: str, extra: tuple[str, ...]) -> Family:
        if name not in families:
            families[name] = _family(name, [*GPU_LABELS, *extra])
        return families[name]

    for gpu in snapshot.gpus:
        base = list(gpu.identity.labels())
        family(c.GPU_UP, ()).add_metric(base, 1.0 if gpu.up else 0.0)
        if not gpu.up:
            family(c.GPU_LOST, ()).add_metric(base, 1.0)
        for sample in gpu.samples:
            if sample.value == 0.0 and sample.metric in SPARSE:
                continue
            extra = tuple(k for k, _ in sample.labels)
            family(sample.metric, extra).add_metric(
                base + [v for _, v in sample.labels], sample.value)
    out = sorted(families.values(), key=lambda f: order.get(_full_name(f), len(order)))
    out.append(gauge(c.GPU_EXPORTER_NVML_UP, HELP[c.GPU_EXPORTER_NVML_UP],
                     value=1.0 if snapshot.nvml_up else 0.0))
    if snapshot.driver_version or snapshot.cuda_version:
        info = gauge(c.GPU_DRIVER_INFO, HELP[c.GPU_DRIVER_INFO],
                     labels=["driver_version", "cuda_version"])
        info.add_metric([snapshot.driver_version or "", snapshot.cuda_version or ""], 1.0)
        out.append(info)
    out.append(gauge(c.GPU_EXPORTER_COLLECTION_DURATION, HELP[c.GPU_EXPORTER_COLLECTION_DURATION],
                     value=snapshot.duration))
    if snapshot.gpm_duration is not None:
        out.append(gauge(c.GPU_EXPORTER_GPM_DURATION, HELP[c.GPU_EXPORTER_GPM_DURATION],
                         value=snapshot.gpm_duration))
    if snapshot.last_success is not None:
        out.append(gauge(c.GPU_EXPORTER_LAST_SUCCESS, HELP[c.GPU_EXPORTER_LAST_SUCCESS],
                         value=snapshot.last_success))
    return out


def _full_name(family: Family) -> str:
    return family.name + "_total" if family.type == "counter" else family.name


class GpuCollector:
    """Served by trainwatch.exporters.node.gpu.http_server; reads the loop's published state only (a
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
        family = counter(c.GPU_XID_ERRORS.removesuffix("_total"), HELP[c.GPU_XID_ERRORS],
                         labels=[*GPU_LABELS, "xid"])
        for (identity, xid), count in self.loop.xid_counts.items():
            family.add_metric([*identity.labels(), xid], float(count))
        yield family

    def _dynamic_families(self, snapshot: Snapshot | None) -> Iterator[Family]:
        yield gauge(c.GPU_EXPORTER_SIMULATED, HELP[c.GPU_EXPORTER_SIMULATED],
                    value=1.0 if self.simulated else 0.0)
        now = time.monotonic()
        if snapshot is not None:
            yield gauge(c.GPU_EXPORTER_DATA_AGE, HELP[c.GPU_EXPORTER_DATA_AGE],
                        value=max(now - snapshot.taken_monotonic, 0.0))
        yield gauge(c.GPU_EXPORTER_STALE, HELP[c.GPU_EXPORTER_STALE],
                    value=1.0 if self.loop.is_stale(now) else 0.0)
        yield gauge(c.GPU_EXPORTER_XID_WATCH_UP, HELP[c.GPU_EXPORTER_XID_WATCH_UP],
                    value=1.0 if self.loop.xid_watch_up() else 0.0)
        collections = counter(c.GPU_EXPORTER_COLLECTIONS.removesuffix("_total"),
                              HELP[c.GPU_EXPORTER_COLLECTIONS], labels=["result"])
        for result, count in self.loop.collections.items():
            collections.add_metric([str(result)], float(count))
        yield collections
        errors = counter(c.GPU_EXPORTER_ERRORS.removesuffix("_total"), HELP[c.GPU_EXPORTER_ERRORS],
                         labels=["call", "error"])
        for (call, error), count in self.loop.errors.items():
            errors.add_metric([call, error], float(count))
        yield errors

