"""`silence`: an Alertmanager v2 silence on the alert's target while the remediation runs.

The engine expires it when the playbook ends (unless `expire_after_playbook: false`), so a
problem the remediation did not fix pages again instead of staying silenced.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

import requests

from trainwatch.remediation.actions.base import Action, ActionContext, ActionError
from trainwatch.remediation.durations import seconds


def run(step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    names = step.get("matchers") or sorted(ctx.labels)
    missing = [n for n in names if n not in ctx.labels]
    if missing:
        raise ActionError(f"silence: labels {missing} not available")
    matchers = [{"name": n, "value": ctx.labels[n], "isRegex": False, "isEqual": True}
                for n in names]
    now = datetime.now(timezone.utc)
    body = {
        "matchers": matchers,
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(seconds=seconds(step["duration"]))).isoformat(),
        "createdBy": "trainwatch-remediation",
        "comment": f"{step.get('comment', 'remediation in progress')} [{ctx.command_id()}]",
    }
    if ctx.dry_run:
        return {"would_silence": matchers}
    try:
        resp = ctx.session.post(f"{ctx.config.alertmanager_url}/api/v2/silences", json=body,
                                auth=ctx.config.alertmanager_auth,
                                timeout=10)
    except requests.RequestException as exc:
        raise ActionError(f"silence: Alertmanager unreachable: {type(exc).__name__}") from exc
    if resp.status_code != 200:
        raise ActionError(f"silence: Alertmanager answered {resp.status_code}")
    return {"silence_id": resp.json().get("silenceID"),
            "expire_after_playbook": step.get("expire_after_playbook", True)}


def expire(silence_id: str, ctx: ActionContext) -> bool:
    """Best effort: a silence that cannot be expired still ends at its endsAt."""
    try:
        resp = ctx.session.delete(
            f"{ctx.config.alertmanager_url}/api/v2/silence/{silence_id}",
            auth=ctx.config.alertmanager_auth, timeout=10)
    except requests.RequestException:
        return False
    return resp.status_code == 200


class Silence(Action):
    name = "silence"

    def after_playbook(self, result: Mapping[str, Any], ctx: ActionContext) -> None:
        """A silence set for the playbook's run ends with it (unless the step said not to), so
        a problem the remediation did not fix pages again."""
        if result.get("silence_id") and result.get("expire_after_playbook", True):
            expire(str(result["silence_id"]), ctx)

    def run(self, step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        return run(step, ctx)


ACTION = Silence()
