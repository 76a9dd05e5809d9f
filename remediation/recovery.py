"""What self-healing saved: how long after a fault's first evidence remediation's alert fired
and its playbook had the job going again (docs/goodput.md, "What remediation saved").

For every firing intent whose steps all completed, two observations per playbook:

* time to detect: first evidence -> the alert firing (Alertmanager's startsAt);
* time to recover: first evidence -> the last step done. For `training_command` that is
  when every rank of the job reported the command applied, i.e. the job's next step runs with
  it (the LR cut's first step at the new LR, a rollback's first step after the restored
  checkpoint), within the action's one-second poll.

First evidence is when Prometheus first saw the alert's condition: the pending alert's
activeAt, which Prometheus keeps as the value of `ALERTS_FOR_STATE` (one scrape and one
evaluation after the fault itself), read at the alert's startsAt. Without it (no `for`, or
Prometheus unreachable) the alert's startsAt stands in, and time to detect is 0.

The histograms are this process's (prometheus_client), like the webhook's latency: with
several remediation replicas, sum them over instances.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import requests
from prometheus_client import CollectorRegistry, Histogram

from trainwatch.exporters.contract import catalog as c
from trainwatch.remediation.actions.prometheus import PrometheusError, instant_query

log = logging.getLogger(__name__)
BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 7200)
ALERTNAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,199}$")


def _histogram(name: str, registry: CollectorRegistry) -> Histogram:
    row = c.METRICS[name]
    return Histogram(name, row.help, list(row.labels), buckets=BUCKETS, registry=registry)


def unix_time(rfc3339: str) -> float | None:
    """Alertmanager's startsAt (RFC 3339, maybe nanoseconds) as Unix time; None if unreadable."""
    try:
        return datetime.fromisoformat(rfc3339).timestamp()
    except (TypeError, ValueError):
        return None


def first_evidence(session: requests.Session, prometheus_url: str, alertname: str,
                   labels: Mapping[str, str], at: float) -> float | None:
    """The activeAt of the alert with these labels, as Prometheus recorded it at `at`.

    Only the alert name (checked against its pattern) goes into the query; the alert's labels
    are matched here, in Python, so no label value ever becomes part of a PromQL string."""
    if not ALERTNAME.match(alertname):
        return None
    try:
        series = instant_query(session, prometheus_url,
                               f'ALERTS_FOR_STATE{{alertname="{alertname}"}}', at=at, timeout=5)
    except PrometheusError as exc:
        log.info("first evidence of %s unknown: %s", alertname, exc)
        return None
    for item in series:
        metric = {k: v for k, v in item.get("metric", {}).items() if k != "__name__"}
        if all(labels.get(k) == v for k, v in metric.items()):
            try:
                return float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                return None
    return None


class RecoveryTimes:
    """The two histograms, per playbook."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.detect = _histogram(c.REMEDIATION_TIME_TO_DETECT, registry)
        self.recover = _histogram(c.REMEDIATION_TIME_TO_RECOVER, registry)

    def observe(self, playbook: str, alert_at: float, recovered_at: float,
                evidence_at: float | None) -> tuple[float, float]:
        """Record one intent; returns (time to detect, time to recover) in seconds."""
        evidence = min(evidence_at, alert_at) if evidence_at is not None else alert_at
        detect, recover = alert_at - evidence, max(0.0, recovered_at - evidence)
        self.detect.labels(playbook).observe(detect)
        self.recover.labels(playbook).observe(recover)
        return detect, recover

    def observe_intent(self, session: requests.Session, prometheus_url: str, playbook: str,
                       alertname: str, labels: Mapping[str, Any], starts_at: str,
                       recovered_at: float) -> tuple[float, float] | None:
        """Look up the first evidence of an intent's alert and record it (never raises:
        the playbook already ran, and a metric must not turn that into a failure)."""
        alert_at = unix_time(starts_at)
        if alert_at is None:
            return None
        try:
            evidence = first_evidence(session, prometheus_url, alertname,
                                      {str(k): str(v) for k, v in labels.items()}, alert_at)
            return self.observe(playbook, alert_at, recovered_at, evidence)
        except Exception:
            log.exception("could not record the recovery times of %s", playbook)
            return None
