"""`http`: call a URL (a pager, a ticketing hook, an annotation API) with an Idempotency-Key."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import requests

from trainwatch.remediation.actions.base import ActionContext, ActionError, timeout_of
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
        resp = ctx.session.request(method, url, json=body, headers=headers,
                                   timeout=timeout_of(step, ctx.config.action_timeout_seconds))
    except requests.RequestException as exc:
        raise ActionError(f"http: {method} {url} failed: {type(exc).__name__}") from exc
    if resp.status_code >= 300:
        raise ActionError(f"http: {method} {url} answered {resp.status_code}")
    return {"called": f"{method} {url}", "status": resp.status_code}
