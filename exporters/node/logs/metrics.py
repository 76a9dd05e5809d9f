"""Prometheus view of a Scanner: a custom collector, so every scrape reads fresh counts."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.node.logs.scanner import Scanner


def _counter(name: str) -> CounterMetricFamily:
    """An empty counter family as its row in the metric table (exporters/contract/catalog.py) says;
    CounterMetricFamily adds `_total` itself."""
    row = c.METRICS[name]
    return CounterMetricFamily(name.removesuffix("_total"), row.help, labels=list(row.labels))


class ScannerCollector(Collector):
    def __init__(self, scanner: Scanner, files_followed: Callable[[], int],
                 read_errors: Callable[[], int]) -> None:
        self.scanner = scanner
        self.files_followed = files_followed
        self.read_errors = read_errors

    def collect(self) -> Iterator[Metric]:
        events = _counter(c.LOG_EVENTS)
        for (job, rank, kind), count in sorted(self.scanner.events().items()):
            events.add_metric([job, rank, kind], count)
        yield events
        xids = _counter(c.LOG_XID_EVENTS)
        for (xid, pci), count in sorted(self.scanner.xid_events().items()):
            xids.add_metric([xid, pci], count)
        yield xids
        lines = _counter(c.LOGSCAN_LINES)
        lines.add_metric([], self.scanner.lines)
        yield lines
        yield GaugeMetricFamily(c.LOGSCAN_FILES_FOLLOWED, c.help_of(c.LOGSCAN_FILES_FOLLOWED),
                                value=self.files_followed())
        read_errors = _counter(c.LOGSCAN_READ_ERRORS)
        read_errors.add_metric([], self.read_errors())
        yield read_errors
