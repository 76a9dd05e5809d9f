"""A real Alertmanager with the production profile's rendered configuration, its remediation
webhook and its team receivers as recording stubs: where the fast alerts' tests
(tests/gpu/test_fast_alerts.py, tests/training/test_fast_killed_rank.py) post."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.remediation.helpers import TOKEN, StubState, stub_server
from tests.support.alertmanager_config import render_one
from tests.support.procs import alertmanager

# Issue 35: a discrete hard event reaches the remediation webhook within this (p99)
DETECTION_BUDGET_SECONDS = 10.0


@dataclass
class FastStack:
    url: str  # the Alertmanager's base URL, what --alertmanager-url takes
    hooks: StubState  # the remediation webhook (posts under /v1/alerts)
    teams: StubState  # every team receiver (paging, infra, ml)


@contextmanager
def production_alertmanager(tmp_path: Path, basic_auth: tuple[str, str] | None = None
                            ) -> Iterator[FastStack]:
    """Alertmanager with the alertmanager role's defaults (production grouping) but the
    receivers' URLs, which point at the stubs; `basic_auth` (user, password) as on a network
    bind, where the role requires it."""
    token = tmp_path / "webhook.token"
    token.write_text(TOKEN)
    with stub_server() as (webhook, hooks), stub_server() as (team, teams):
        config = render_one({
            "alertmanager_remediation_urls": [f"http://{webhook}/v1/alerts"],
            "alertmanager_remediation_token_file": str(token),
            "alertmanager_receiver_configs": {
                name: {"webhook_configs": [{"url": f"http://{team}/{name}"}]}
                for name in ("paging", "infra", "ml")}}, tmp_path / "render")
        with alertmanager(tmp_path, config, basic_auth=basic_auth) as am:
            yield FastStack(am, hooks, teams)
