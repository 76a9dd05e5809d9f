"""A fatal XID reaches the remediation webhook within seconds with the production profile's
Alertmanager settings (group_wait 30 s): the GPU exporter (fake NVML, a real process) posts
the XID straight to a real Alertmanager with the rendered configuration, whose fast route
sends it to the webhook at once and to no team receiver (people are paged by the rule's own
alert, with its `for:`)."""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support.fast_alerts import DETECTION_BUDGET_SECONDS, production_alertmanager
from tests.support.net import free_port, wait_until
from tests.support.procs import running
from trainwatch.exporters.contract.catalog import LABEL_EVENT, LABEL_FAST
from trainwatch.exporters.node.fast_alerts import FastAlerts
from trainwatch.exporters.node.gpu.config import ConfigError, build_parser, resolve
from trainwatch.exporters.node.gpu.fake_nvml import simulated_scenario

AM_USER = "trainwatch"


@contextlib.contextmanager
def xid_exporter(tmp_path: Path, scenario: Path, am: str,
                 credential: Sequence[str] = ()) -> Iterator[None]:
    """A gpu-exporter on the fake NVML `scenario`, posting XIDs of node-b to `am`, running
    until the block ends; yields once its XID watch is up."""
    port = free_port()
    with running([str(Path(sys.executable).parent / "gpu-exporter"), "--bind", "127.0.0.1",
                  "--port", str(port), "--interval", "1", "--no-gpm", "--node", "node-b",
                  "--alertmanager-url", am, *credential],
                 tmp_path / "gpu-exporter.log", ready_url=f"http://127.0.0.1:{port}/metrics",
                 env={"TRAINWATCH_FAKE_NVML": str(scenario)}):
        wait_until(lambda: b"xid" in _metrics(port), timeout=30, what="the XID watch running")
        yield


@pytest.mark.parametrize("auth", [False, True], ids=["loopback", "basic_auth"])
def test_an_xid_reaches_the_webhook_in_seconds_with_production_grouping(
        tmp_path: Path, auth: bool) -> None:
    """Also where the Alertmanager requires basic auth (the alertmanager role's network
    bind): the exporter sends the credential from its password file."""
    password = secrets.token_urlsafe(16)
    with production_alertmanager(tmp_path, (AM_USER, password) if auth else None) as stack:
        am, hooks, teams = stack.url, stack.hooks, stack.teams
        scenario = tmp_path / "nvml.json"
        scenario.write_text(json.dumps(simulated_scenario(2, dynamic=False)))
        credential: list[str] = []
        if auth:
            unauthenticated = FastAlerts([am])  # without the credential: refused, counted
            unauthenticated.post("GpuXidErrors", {"node": "node-b"}, "no credential")
            wait_until(lambda: unauthenticated.dropped == 1, timeout=30,
                       what="the post without a credential refused")
            unauthenticated.close()
            password_file = tmp_path / "am.password"
            password_file.write_text(password + "\n")
            password_file.chmod(0o600)
            credential = ["--alertmanager-username", AM_USER,
                          "--alertmanager-password-file", str(password_file)]
        with xid_exporter(tmp_path, scenario, am, credential):
            doc = json.loads(scenario.read_text())
            doc["xid_events"] = [{"gpu": 1, "xid": 79}]
            scenario.write_text(json.dumps(doc))
            written = time.monotonic()
            [post] = wait_until(lambda: hooks.posts("/v1/alerts"),
                                timeout=DETECTION_BUDGET_SECONDS * 3, interval=0.05,
                                what="the webhook notified")
            took = time.monotonic() - written
        [alert] = post.body["alerts"]
        assert {k: alert["labels"][k] for k in ("alertname", "node", "gpu", "xid",
                                                LABEL_FAST)} == {
            "alertname": "GpuXidErrors", "node": "node-b", "gpu": "1", "xid": "79",
            LABEL_FAST: "true"}
        assert took <= DETECTION_BUDGET_SECONDS, f"{took:.1f}s from the XID to the webhook"
        assert not teams.posts(), "the fast copy pages nobody"


def test_the_same_xid_again_on_the_same_gpu_reaches_the_webhook_again(tmp_path: Path) -> None:
    """A node returned to service after a fatal XID that faults again the same way (same GPU,
    same XID) minutes later: the second event is a new alert, not merged into the first one
    Alertmanager still holds (the fast alert lives ten minutes)."""
    with production_alertmanager(tmp_path, None) as stack:
        scenario = tmp_path / "nvml.json"
        scenario.write_text(json.dumps(simulated_scenario(1, dynamic=False)))
        with xid_exporter(tmp_path, scenario, stack.url):
            firing: set[tuple[str, str]] = set()

            def notified_events() -> set[tuple[str, str]]:
                for post in stack.hooks.posts("/v1/alerts"):
                    firing.update((a["labels"].get(LABEL_EVENT, ""), a["startsAt"])
                                  for a in post.body["alerts"] if a["status"] == "firing")
                return firing

            for count in (1, 2):
                doc = json.loads(scenario.read_text())
                doc.setdefault("xid_events", []).append({"gpu": 0, "xid": 79})
                scenario.write_text(json.dumps(doc))
                written = time.monotonic()
                wait_until(lambda count=count: len(notified_events()) >= count,
                           timeout=DETECTION_BUDGET_SECONDS * 3, interval=0.05,
                           what=f"XID event {count} at the webhook")
                took = time.monotonic() - written
                assert took <= DETECTION_BUDGET_SECONDS, f"event {count}: {took:.1f}s"
        assert len(notified_events()) == 2


def _metrics(port: int) -> bytes:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return bytes(resp.read())


@pytest.mark.parametrize("argv", [
    ["--alertmanager-url", "http://am:9093"],  # no --node
    ["--alertmanager-url", "file:///etc/passwd", "--node", "n1"],
    ["--alertmanager-url", "http://user:pw@am:9093", "--node", "n1"],
    ["--alertmanager-url", "http://am:9093", "--node", "gpu-[01-64]"],
])
def test_bad_fast_alert_settings_are_refused(argv: list[str]) -> None:
    with pytest.raises(ConfigError):
        resolve(build_parser().parse_args(argv))


@pytest.mark.parametrize("mode,text,extra", [
    (0o644, "pw\n", []),  # world-readable: anyone on the node could post alerts that act
    (0o600, "\n", []),  # empty
    (0o600, "pw\n", ["--alertmanager-username", "a b"]),
    (0o600, "pw\n", ["--alertmanager-username", ""]),
], ids=["world_readable", "empty", "bad_user", "no_user"])
def test_bad_alertmanager_credentials_are_refused(tmp_path: Path, mode: int, text: str,
                                                  extra: list[str]) -> None:
    password_file = tmp_path / "am.password"
    password_file.write_text(text)
    password_file.chmod(mode)
    user = [] if extra else ["--alertmanager-username", AM_USER]
    argv = ["--alertmanager-url", "http://am:9093", "--node", "n1", *user, *extra,
            "--alertmanager-password-file", str(password_file)]
    with pytest.raises(ConfigError):
        resolve(build_parser().parse_args(argv))


def test_the_password_stays_out_of_the_settings_repr(tmp_path: Path) -> None:
    password_file = tmp_path / "am.password"
    password_file.write_text("s3cret-pw\n")
    password_file.chmod(0o600)
    settings = resolve(build_parser().parse_args([
        "--alertmanager-url", "http://am:9093", "--node", "n1", "--alertmanager-username",
        AM_USER, "--alertmanager-password-file", str(password_file)]))
    assert settings.alertmanager_credential is not None
    assert settings.alertmanager_credential.password == "s3cret-pw"
    assert "s3cret-pw" not in repr(settings)
