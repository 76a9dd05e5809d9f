"""What every action gets: validated labels, the config, an HTTP session, an idempotency key."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import requests

from trainwatch.remediation.config import Config


class ActionError(RuntimeError):
    """The step did not achieve its effect; the message goes into the audit record."""


@dataclass
class ActionContext:
    config: Config
    labels: dict[str, str]  # only allowlisted values (trainwatch.remediation.labels.safe_labels)
    idempotency_key: str  # stable across retries and restarts of the same step
    session: requests.Session
    dry_run: bool = False
    # what the engine decided before the steps (trainwatch.remediation.actions.quarantine.Plan), if
    # any
    plan: Any = None

    @property
    def template_config(self) -> dict[str, str | None]:
        return {"pager_url": self.config.pager_url,
                "alertmanager_url": self.config.alertmanager_url,
                "prometheus_url": self.config.prometheus_url}

    def command_id(self) -> str:
        """A short id derived from the idempotency key, usable in URLs and as a command id."""
        return hashlib.sha256(self.idempotency_key.encode()).hexdigest()[:32]


def timeout_of(step: dict[str, Any], default: float) -> float:
    from trainwatch.remediation.durations import seconds

    return seconds(step["timeout"]) if "timeout" in step else default
