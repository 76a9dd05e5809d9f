"""/metrics: decisions and actions are read from the shared store at scrape time, so the
numbers are the same whichever process (or how many) answers the scrape. They come from the
running totals a trigger keeps with every audit insert (store.counters), not from a scan of
the audit table: a scrape costs a few row reads however long the history, and the totals
never go backwards, audit retention included."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from trainwatch.exporters.contract import catalog as c
from trainwatch.remediation.actions.quarantine import node_faults
from trainwatch.remediation.config import Config
from trainwatch.remediation.store import PRIORITIES, Store


def _family(name: str, value: float | None = None) -> GaugeMetricFamily | CounterMetricFamily:
    """A family as its row in the metric table (exporters/contract/catalog.py) says: with `value`,
    the
    single unlabelled sample; without, empty, to be filled by label."""
    row = c.METRICS[name]
    if row.type == c.COUNTER:
        return CounterMetricFamily(name.removesuffix("_total"), row.help, labels=list(row.labels))
    if value is not None:
        return GaugeMetricFamily(name, row.help, value=value)
    return GaugeMetricFamily(name, row.help, labels=list(row.labels))


def _counter(name: str, registry: CollectorRegistry) -> Counter:
    row = c.METRICS[name]
    return Counter(name.removesuffix("_total"), row.help, list(row.labels), registry=registry)


class StoreCollector(Collector):
    def __init__(self, store: Store, config: Config) -> None:
        self.store = store
        self.config = config

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        decisions = _family(c.REMEDIATION_DECISIONS)
        for decision, count in sorted(self.store.decision_counts().items()):
            decisions.add_metric([decision], count)
        yield decisions
        actions = _family(c.REMEDIATION_ACTIONS)
        for playbook, action, decision, count in self.store.action_counts():
            result = "succeeded" if decision == "acted" else "failed"
            actions.add_metric([playbook, action, result], count)
        yield actions
        states = _family(c.REMEDIATION_INTENTS)
        for state, count in sorted(self.store.state_counts().items()):
            states.add_metric([state], count)
        yield states
        yield _family(c.REMEDIATION_OLDEST_PENDING_AGE, self.store.oldest_pending_age())
        # one read of the breaker window: grants by priority, each breaker counting its own
        # priority and above (a quarantine's own grant, priority -1, counts in none)
        by_level = self.store.grants_by_priority(
            time.time() - self.config.breaker_window_seconds)

        def at_or_above(level: int) -> int:
            return sum(count for priority, count in by_level.items() if priority >= level)

        by_priority = _family(c.REMEDIATION_CIRCUIT_BREAKER_PRIORITY_OPEN)
        for name, level in PRIORITIES.items():
            by_priority.add_metric([name], 1.0 if at_or_above(level) >= self.config.breaker_limit(
                name) else 0.0)
        granted = at_or_above(PRIORITIES["normal"])
        yield _family(c.REMEDIATION_CIRCUIT_BREAKER_OPEN,
                      1.0 if granted >= self.config.breaker_limit("normal") else 0.0)
        yield by_priority
        total = at_or_above(0)
        yield _family(c.REMEDIATION_ACTIONS_IN_BREAKER_WINDOW, total)
        yield from self._lemon_nodes()

    def _lemon_nodes(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Per node quarantined in the window: how often, how far apart the last two, and
        whether it is kept out (the operator's lemon-node list)."""
        faults = _family(c.REMEDIATION_NODE_FAULTS)
        interval = _family(c.REMEDIATION_NODE_FAULT_INTERVAL)
        kept = _family(c.REMEDIATION_NODE_KEPT_OUT)
        settings = self.config.scheduler
        if settings is not None:
            for node, times in sorted(node_faults(self.store, settings, time.time()).items()):
                faults.add_metric([node], len(times))
                if len(times) > 1:
                    interval.add_metric([node], times[-1] - times[-2])
                kept.add_metric([node], 1.0 if len(times) >= settings.lemon_faults else 0.0)
        yield faults
        yield interval
        yield kept


class WebhookMetrics:
    """Per-process request metrics (the HTTP layer, not the store)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = _counter(c.REMEDIATION_WEBHOOK_REQUESTS, registry)
        row = c.METRICS[c.REMEDIATION_WEBHOOK_DURATION]
        self.latency = Histogram(row.name, row.help, list(row.labels),
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5),
                                 registry=registry)
        self.alerts = _counter(c.REMEDIATION_WEBHOOK_ALERTS, registry)
