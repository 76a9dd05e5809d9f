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

from exporters.catalog import REMEDIATION_PREFIX as P
from remediation.config import Config
from remediation.store import PRIORITIES, Store


class StoreCollector(Collector):
    def __init__(self, store: Store, config: Config) -> None:
        self.store = store
        self.config = config

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        decisions = CounterMetricFamily(
            f"{P}decisions", "Audit records by decision (acted, refused, cooled_down, ...)",
            labels=["decision"])
        for decision, count in sorted(self.store.decision_counts().items()):
            decisions.add_metric([decision], count)
        yield decisions
        actions = CounterMetricFamily(
            f"{P}actions", "Playbook executions that finished, by result (succeeded|failed)",
            labels=["playbook", "action", "result"])
        for playbook, action, decision, count in self.store.action_counts():
            result = "succeeded" if decision == "acted" else "failed"
            actions.add_metric([playbook, action, result], count)
        yield actions
        states = GaugeMetricFamily(f"{P}intents", "Intents in the store by state",
                                   labels=["state"])
        for state, count in sorted(self.store.state_counts().items()):
            states.add_metric([state], count)
        yield states
        yield GaugeMetricFamily(f"{P}oldest_pending_age_seconds",
                                "Age of the oldest intent not yet finished",
                                value=self.store.oldest_pending_age())
        conn = self.store._conn()
        since = time.time() - self.config.breaker_window_seconds
        by_priority = GaugeMetricFamily(
            f"{P}circuit_breaker_priority_open",
            "1 while the circuit breaker of this playbook priority refuses to act",
            labels=["priority"])
        for name, level in PRIORITIES.items():
            count, _ = Store.grants_since(conn, since, min_priority=level)
            by_priority.add_metric([name], 1.0 if count >= self.config.breaker_limit(name)
                                   else 0.0)
        granted, _ = Store.grants_since(conn, since, min_priority=PRIORITIES["normal"])
        yield GaugeMetricFamily(f"{P}circuit_breaker_open",
                                "1 while the circuit breaker of normal-priority playbooks "
                                "refuses to act (see circuit_breaker_priority_open)",
                                value=1.0 if granted >= self.config.breaker_limit("normal")
                                else 0.0)
        yield by_priority
        total, _ = Store.grants_since(conn, since)
        yield GaugeMetricFamily(f"{P}actions_in_breaker_window",
                                "Actions granted inside the circuit breaker window",
                                value=total)


class WebhookMetrics:
    """Per-process request metrics (the HTTP layer, not the store)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(f"{P}webhook_requests", "Webhook requests by HTTP status",
                                ["code"], registry=registry)
        self.latency = Histogram(f"{P}webhook_duration_seconds",
                                 "Time to persist and answer a webhook request",
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5),
                                 registry=registry)
        self.alerts = Counter(f"{P}webhook_alerts", "Alerts received, by outcome at intake",
                              ["outcome"], registry=registry)
