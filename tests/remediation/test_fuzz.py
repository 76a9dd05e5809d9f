"""Acceptance 4: >= 2000 generated hostile or malformed webhook payloads through the Flask test
client: never a 5xx, never an action (the target server receives nothing, no grant is made)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.remediation.conftest import make_service
from tests.remediation.helpers import auth, stub_server

HOSTILE = st.sampled_from([
    "; rm -rf /", "$(reboot)", "`id`", "../../etc/passwd", "..", "a/../../b", "-oProxyCommand=x",
    "a b", "a\nb", "x|y", "x&&y", "'", '"', "\\", "a\x00b", "*", "~root", "${IFS}", "job\t",
    "é", "a" * 200, "--limit=all", "/", "%2e%2e%2f",
])
HOSTILE_VALUE = st.one_of(HOSTILE, st.builds(lambda a, h, b: a + h + b,
                                             st.text(max_size=8), HOSTILE, st.text(max_size=8)))
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                      st.text(max_size=20))
ANY_JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=20)


@st.composite
def hostile_alert(draw: Any) -> dict[str, Any]:
    labels: dict[str, Any] = {"alertname": draw(st.sampled_from(
        ["TrainingLossSpike", "TrainingLossSpike", "Other", ""]))}
    if draw(st.booleans()):
        labels["training_job"] = draw(HOSTILE_VALUE)  # hostile or absent: never safe
    labels.update(draw(st.dictionaries(st.text(max_size=12), st.one_of(HOSTILE_VALUE, JSON_LEAF),
                                       max_size=3)))
    alert: dict[str, Any] = {
        "status": draw(st.sampled_from(["firing", "resolved", "FIRING", 1, None])),
        "labels": labels,
        "annotations": draw(st.one_of(st.dictionaries(st.text(max_size=5), st.text(max_size=5),
                                                      max_size=2), ANY_JSON)),
        "startsAt": draw(st.one_of(st.just("2026-11-21T18:03:15Z"), st.text(max_size=70),
                                   JSON_LEAF)),
        "fingerprint": draw(st.one_of(st.text("0123456789abcdef", min_size=1, max_size=16),
                                      HOSTILE_VALUE, JSON_LEAF)),
    }
    for key in draw(st.lists(st.sampled_from(list(alert)), max_size=2)):
        alert.pop(key, None)  # missing required fields
    return alert


@st.composite
def hostile_payload(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["structured", "structured", "structured", "any", "huge",
                                 "bytes"]))
    if kind == "any":
        return json.dumps(draw(ANY_JSON)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    body: dict[str, Any] = {
        "version": draw(st.sampled_from(["4", "4", 4, "3", None])),
        "status": draw(st.sampled_from(["firing", "resolved", "x", 0])),
        "alerts": draw(st.one_of(st.lists(hostile_alert(), max_size=4), ANY_JSON)),
        "truncatedAlerts": draw(st.one_of(st.just(0), st.integers(-5, 5), JSON_LEAF)),
        "groupKey": draw(st.one_of(st.text(max_size=20), JSON_LEAF)),
    }
    if kind == "huge":
        body["commonAnnotations"] = {"x": "y" * draw(st.integers(70_000, 300_000))}
    return json.dumps(body).encode()


def test_fuzzed_webhook_never_5xx_never_acts(tmp_path: Path) -> None:
    seen: dict[int, int] = {}
    with stub_server() as (hostport, state):
        book = {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
                "target": ["training_job"],
                "steps": [{"action": "http",
                           "url": f"http://{hostport}/act/${{labels.training_job}}"}]}
        with make_service(tmp_path, [book], max_body_bytes=65536) as svc:

            @settings(max_examples=2000, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(hostile_payload())
            def check(body: bytes) -> None:
                resp = svc.client.post("/v1/alerts", data=body, headers=auth(),
                                       content_type="application/json")
                seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
                assert resp.status_code < 500, resp.data[:500]

            check()
            svc.wait_idle()
            assert sum(seen.values()) >= 2000
            assert state.requests == []
            assert svc.audit("acted") == []
            conn = svc.store._conn()
            assert conn.execute("SELECT count(*) FROM grants").fetchone()[0] == 0
    assert {200, 400, 413} <= set(seen), seen
