"""One deadline per outgoing call: a pager or an `http` step target that trickles its answer
(one byte at a time, each within any per-read timeout) fails the call at its deadline."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from tests.remediation.helpers import stub_server, write_config
from tests.remediation.trickle import TricklingServer
from trainwatch.remediation.actions.base import ActionContext, ActionError
from trainwatch.remediation.actions.registry import ACTIONS
from trainwatch.remediation.config import Config, load_config
from trainwatch.remediation.outgoing import CallFailed, call
from trainwatch.remediation.pager import Page, Pager


def test_a_trickling_answer_fails_the_call_at_its_deadline() -> None:
    with TricklingServer() as server:
        started = time.monotonic()
        with pytest.raises(CallFailed, match="within 1s"):
            call("POST", server.url, json_body={"event": "x"}, deadline_seconds=1.0)
        assert time.monotonic() - started < 5


def test_a_prompt_answer_is_read() -> None:
    with stub_server() as (addr, state):
        answer = call("POST", f"http://{addr}/page", json_body={"a": 1}, deadline_seconds=5)
        assert answer.status == 200 and state.posts("/page")[0].body == {"a": 1}


def test_the_http_step_has_one_deadline(config: Config) -> None:
    with TricklingServer() as server:
        ctx = ActionContext(config=config, labels={}, idempotency_key="k",
                            session=requests.Session())
        started = time.monotonic()
        with pytest.raises(ActionError, match="within 1s"):
            ACTIONS["http"].run({"action": "http", "url": server.url, "timeout": "1s"}, ctx)
        assert time.monotonic() - started < 5


def test_pages_are_sent_off_the_callers_path() -> None:
    with TricklingServer() as server:
        pager = Pager(server.url, deadline_seconds=2.0)
        started = time.monotonic()
        pager.send(Page("quarantine_awaiting_approval", 1, "GpuLost", "held"))
        assert time.monotonic() - started < 0.5
        pager.stop(timeout=10)
        assert pager.failed == 1 and pager.sent == 0


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return load_config(write_config(tmp_path))
