"""Prometheus view of a Scanner: a custom collector, so every scrape reads fresh counts."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters.catalog import LABEL_JOB, LABEL_RANK, LOG_EVENTS, LOG_XID_EVENTS, LOGSCAN_PREFIX
from exporters.logs.scanner import Scanner


def _counter_name(name: str) -> str:
    """CounterMetricFamily adds `_total` itself."""
    return name[: -len("_total")] if name.endswith("_total") else name


class ScannerCollector(Collector):
    def __init__(self, scanner: Scanner, files_followed: Callable[[], int],
                 read_errors: Callable[[], int]) -> None:
        self.scanner = scanner
        self.files_followed = files_followed
        self.read_errors = read_errors

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            _counter_name(LOG_EVENTS), "Failure events found in training logs, by class.",
            labels=[LABEL_JOB, LABEL_RANK, "kind"])
        for (job, rank, kind), count in sorted(self.scanner.events().items()):
            events.add_metric([job, rank, kind], count)
        yield events
        xids = CounterMetricFamily(
            _counter_name(LOG_XID_EVENTS), "NVIDIA driver Xid events in the kernel log.",
            labels=["xid", "pci_bus_id"])
        for (xid, pci), count in sorted(self.scanner.xid_events().items()):
            xids.add_metric([xid, pci], count)
        yield xids
        yield CounterMetricFamily(f"{LOGSCAN_PREFIX}lines", "Log lines scanned.",
                                  value=self.scanner.lines)
        yield GaugeMetricFamily(f"{LOGSCAN_PREFIX}files_followed", "Log files being followed.",
                                value=self.files_followed())
        yield CounterMetricFamily(f"{LOGSCAN_PREFIX}read_errors",
                                  "Errors opening or reading log sources.",
                                  value=self.read_errors())
