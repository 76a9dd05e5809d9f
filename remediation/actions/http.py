"""`http`: call a URL (a pager, a ticketing hook, an annotation API) with an Idempotency-Key.

The step's `timeout` (default the action timeout) is one deadline for the whole call
(trainwatch.remediation.outgoing), not for each read: a server that trickles its answer fails
the step at the deadline instead of holding a worker."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from trainwatch.remediation.actions.base import Action, ActionContext, ActionError, timeout_of
from trainwatch.remediation.outgoing import CallFailed, call
from trainwatch.remediation.templating import TemplateError, render


def run(step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    try:
        url = render(step["url"], ctx.labels, ctx.template_config, url=True)
        body = render(step.get("json"), ctx.labels, ctx.template_config)
        headers = render(step.get("headers", {}), ctx.labels, ctx.template_config)
    except TemplateError as exc:
        raise ActionError(f"http: {exc}") from exc
    if urlsplit(url).scheme not in ("http", "https"):
        raise ActionError("http: only http(s) URLs are allowed")
    method = step.get("method", "POST")
    if ctx.dry_run:
        return {"would_call": f"{method} {url}", "json": body}
    headers = {**headers, "Idempotency-Key": ctx.command_id()}
    try:
        answer = call(method, url, json_body=body, headers=headers,
                      deadline_seconds=timeout_of(step, ctx.config.action_timeout_seconds))
    except CallFailed as exc:
        raise ActionError(f"http: {method} {url} failed: {exc}") from exc
    if answer.status >= 300:
        raise ActionError(f"http: {method} {url} answered {answer.status}")
    return {"called": f"{method} {url}", "status": answer.status}


class Http(Action):
    name = "http"

    def run(self, step: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        return run(step, ctx)


ACTION = Http()
