"""The Prometheus look-ups remediation makes, in one place: the instant query and what the
actions ask of it (the nodes where a job's ranks still heartbeat; when the job last stepped).

Why here and not in one action: `ansible` (hosts_from: job_nodes) and `training_command` both
find a job's nodes, and an error must name the action whose step failed, not the module the
query happened to live in. Only allowlisted label values (trainwatch.remediation.labels) ever go
into a
query, and every label read back is validated before it is used as a host or URL.
"""

from __future__ import annotations

import re
from typing import Any

import requests

from trainwatch.exporters.contract.catalog import (
    LABEL_JOB,
    RANK_DEPARTED_AFTER_SECONDS,
    TRAINING_NODE_HEARTBEAT_TIMESTAMP,
    TRAINING_NODE_LAST_STEP_TIMESTAMP,
)
from trainwatch.remediation.actions.base import ActionContext, ActionError

# host:port as a Prometheus target's `instance` label spells it (a name, or [IPv6])
INSTANCE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$")
QUERY_TIMEOUT = 10.0  # seconds, unless the caller says otherwise


class PrometheusError(RuntimeError):
    """Prometheus did not answer the query (unreachable, an error status, a body that is not
    a query result)."""


def instant_query(session: requests.Session | Any, prometheus_url: str, expr: str, *,
                  at: float | None = None, timeout: float = QUERY_TIMEOUT
                  ) -> list[dict[str, Any]]:
    """The series of an instant query (`at`: evaluation time, Unix seconds; now if None)."""
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    try:
        resp = session.get(f"{prometheus_url}/api/v1/query", params=params, timeout=timeout)
        resp.raise_for_status()
        return list(resp.json()["data"]["result"])
    except (requests.RequestException, KeyError, TypeError, ValueError) as exc:
        raise PrometheusError(str(exc)) from exc


def job_instances(ctx: ActionContext, job: str, *, action: str,
                  within: float = RANK_DEPARTED_AFTER_SECONDS) -> list[str]:
    """host:port of every training exporter where a rank of the job heartbeated within
    `within` seconds (by default RANK_DEPARTED_AFTER_SECONDS: an exporter whose ranks all left
    holds nobody to act on), validated before use. `action` names the step's action in every
    error."""
    # job is allowlisted: no quotes inside
    query = (f'{TRAINING_NODE_HEARTBEAT_TIMESTAMP}{{{LABEL_JOB}="{job}"}} '
             f'> time() - {within:g}')
    try:
        series = instant_query(ctx.session, ctx.config.prometheus_url, query)
    except PrometheusError as exc:
        raise ActionError(f"{action}: Prometheus query failed: {exc}") from exc
    instances = sorted({s.get("metric", {}).get("instance", "") for s in series})
    bad = [i for i in instances if not INSTANCE.match(i)]
    if bad:
        raise ActionError(f"{action}: refusing malformed instance labels {bad[:3]!r}")
    return instances


def job_last_step(session: requests.Session | Any, prometheus_url: str, job: str) -> float | None:
    """Unix time of the newest step of `job` that any training exporter serves (None: no
    exporter serves a step of it); PrometheusError when Prometheus does not answer. `job`
    must be allowlisted (trainwatch.remediation.labels): it goes into the query."""
    query = f'max({TRAINING_NODE_LAST_STEP_TIMESTAMP}{{{LABEL_JOB}="{job}"}})'
    newest = None
    for item in instant_query(session, prometheus_url, query):
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PrometheusError(f"unreadable sample {item!r:.200}") from exc
        newest = value if newest is None else max(newest, value)
    return newest
