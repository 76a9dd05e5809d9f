"""The Alertmanager template: valid for amtool, routes pinned per alert, inhibition real.

Routing is checked with `amtool config routes test --verify.receivers` against the config the
alertmanager role renders (Ansible, render-only: tests/support/alertmanager_config.py) from
alert_rules/alertmanager.yml.j2; inhibition with a real Alertmanager that gets alerts through
its v2 API.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests
import yaml

from alert_rules import overlay as overlays
from scripts import build
from tests.rules.rulefiles import ROOT, alerts
from tests.support.alertmanager_config import refused_variants, render_alertmanager
from tests.support.net import wait_until
from tests.support.procs import alertmanager

TEAM = {"gpu": "infra", "node": "infra", "stack": "infra", "training": "ml"}


def expected_receivers(name: str, labels: dict[str, str], remediation: bool) -> list[str]:
    """The routing policy in words: remediation (every alert: its playbooks decide), then the
    pager for critical, then the owning team; Watchdog only to deadman."""
    if name == "Watchdog":
        return ["deadman"]
    out = ["remediation"] if remediation else []
    if labels["severity"] == "critical":
        out.append("paging")
    out.append(TEAM[labels["component"]])
    return out


def amtool(real_binaries: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([real_binaries["amtool"], *args], capture_output=True, text=True)


CONFIGURED = {
    "alertmanager_receiver_configs": {
        "paging": {"pagerduty_configs": [{"routing_key_file": "/opt/trainwatch/etc/pd.key"}]},
        "infra": {"webhook_configs": [{"url": "http://127.0.0.1:1/infra"}]},
        "ml": {"email_configs": [{"to": "ml-oncall@example.org", "from": "am@example.org",
                                  "smarthost": "127.0.0.1:25"}]},
    },
    "alertmanager_group_wait": "1s",
}
# a user overlay's receivers, as `python -m scripts.build --overlay` writes them
OVERLAY_RECEIVERS = {
    "deadman": {"webhook_configs": [{"url": "https://heartbeat.example.org/ping/abc"}]},
    "ml": {"webhook_configs": [{"url": "http://127.0.0.1:1/ml"}]},
}
VARIANTS = {"defaults": {}, "receivers-configured": CONFIGURED,
            "remediation-off": {"alertmanager_remediation_enabled": False},
            "from-overlay": overlays.ansible_vars(
                overlays.parse({"receivers": OVERLAY_RECEIVERS}))}


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory, real_binaries: dict[str, str]
            ) -> dict[str, Path]:
    """Every variant rendered by the role in one Ansible run (amtool check-config included)."""
    return render_alertmanager(VARIANTS, tmp_path_factory.mktemp("alertmanager"))


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_config_passes_amtool_check_config(real_binaries: dict[str, str],
                                                    configs: dict[str, Path],
                                                    variant: str) -> None:
    result = amtool(real_binaries, "check-config", str(configs[variant]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert stat.S_IMODE(configs[variant].stat().st_mode) == 0o640  # receiver secrets inside


def test_default_receivers_have_no_integrations(configs: dict[str, Path]) -> None:
    """Disabled until configured: nothing is sent to a made-up default address."""
    receivers = {r["name"]: r for r in yaml.safe_load(configs["defaults"].read_text())["receivers"]}
    for name in ("paging", "infra", "ml", "deadman"):
        assert set(receivers[name]) == {"name"}, receivers[name]
    hook = receivers["remediation"]["webhook_configs"][0]
    assert hook["http_config"]["authorization"]["credentials_file"].endswith(".token")
    assert hook["send_resolved"] is True  # gpu_power_limit restores on resolve


def test_an_overlays_receivers_reach_the_rendered_config(configs: dict[str, Path]) -> None:
    """Issue 26: the Watchdog's dead man's switch can be given (it could not before: the
    template rendered `deadman` with no body whatever the variables said)."""
    receivers = {r["name"]: r for r in
                 yaml.safe_load(configs["from-overlay"].read_text())["receivers"]}
    for name, body in OVERLAY_RECEIVERS.items():
        assert {k: v for k, v in receivers[name].items() if k != "name"} == body
    assert set(receivers["paging"]) == {"name"}


def test_the_build_writes_the_overlays_receivers_as_the_roles_variables(
        tmp_path: Path) -> None:
    overlay = tmp_path / "overlay.yml"
    overlay.write_text(yaml.safe_dump({"receivers": OVERLAY_RECEIVERS}))
    tree = build.plan(tmp_path / "out", overlays.load(overlay), only=["Alertmanager receivers"])
    assert yaml.safe_load(tree.files[build.ALERTMANAGER_VARS]) == VARIANTS["from-overlay"]
    assert build.plan(tmp_path / "out", only=["Alertmanager receivers"]).files == {}
    overlay.write_text(yaml.safe_dump({"receivers": {"pager": {}}}))
    result = subprocess.run([sys.executable, "-m", "scripts.build", "--overlay", str(overlay),
                             "--out", str(tmp_path / "out")], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == 2 and "pager" in result.stderr and not result.stdout
    assert not (tmp_path / "out").exists()


def test_receiver_bodies_are_passed_through_verbatim(configs: dict[str, Path]) -> None:
    config = yaml.safe_load(configs["receivers-configured"].read_text())
    receivers = {r["name"]: r for r in config["receivers"]}
    for name, body in CONFIGURED["alertmanager_receiver_configs"].items():
        assert {k: v for k, v in receivers[name].items() if k != "name"} == body


@pytest.mark.parametrize("remediation", [True, False], ids=["remediation-on", "remediation-off"])
def test_every_alert_reaches_its_pinned_receivers(real_binaries: dict[str, str],
                                                  configs: dict[str, Path],
                                                  remediation: bool) -> None:
    config = configs["defaults" if remediation else "remediation-off"]
    wrong = []
    for name, rule in sorted(alerts("production").items()):
        labels = rule["labels"]
        expected = ",".join(expected_receivers(name, labels, remediation))
        result = amtool(real_binaries, "config", "routes", "test",
                        f"--config.file={config}", f"--verify.receivers={expected}",
                        f"alertname={name}", *(f"{k}={v}" for k, v in labels.items()),
                        "training_job=llm", "node=h1", "gpu=0")
        if result.returncode != 0:
            wrong.append(f"{name}: expected {expected}, got {result.stdout.strip()}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(("labels", "receivers"), [
    ({"alertname": "GpuLost", "severity": "critical", "component": "gpu"},
     "remediation,paging,infra"),
    ({"alertname": "GpuTemperatureHigh", "severity": "warning", "component": "gpu"},
     "remediation,infra"),
    ({"alertname": "TrainingLossSpike", "severity": "warning", "component": "training"},
     "remediation,ml"),
    ({"alertname": "TrainingNonFiniteLoss", "severity": "critical", "component": "training"},
     "remediation,paging,ml"),
    ({"alertname": "NodeDiskFilling", "severity": "warning", "component": "node"},
     "remediation,infra"),
    # no playbook matches these: the webhook records them as unmatched
    ({"alertname": "TargetDown", "severity": "warning", "component": "stack"},
     "remediation,infra"),
    ({"alertname": "Watchdog", "severity": "info", "component": "stack"}, "deadman"),
    ({"alertname": "SomethingNew", "severity": "warning"}, "remediation,infra"),
])
def test_alert_classes_route_as_documented(real_binaries: dict[str, str],
                                           configs: dict[str, Path],
                                           labels: dict[str, str], receivers: str) -> None:
    config = configs["defaults"]
    result = amtool(real_binaries, "config", "routes", "test", f"--config.file={config}",
                    f"--verify.receivers={receivers}", *(f"{k}={v}" for k, v in labels.items()))
    assert result.returncode == 0, result.stdout + result.stderr


BAD_VARIANTS = {
    "enabled-not-a-bool": ({"alertmanager_remediation_enabled": "maybe"},
                           "alertmanager_remediation_enabled"),
    "unknown-receiver": ({"alertmanager_receiver_configs": {"pager": {}}}, "pager"),
    "body-not-a-mapping": ({"alertmanager_receiver_configs": {"paging": "pagerduty"}},
                           "paging"),
    "url-not-http": ({"alertmanager_remediation_url": "file:///etc/passwd"},
                     "alertmanager_remediation_url"),
}


def test_bad_variables_are_refused_and_nothing_is_written(tmp_path: Path,
                                                          real_binaries: dict[str, str]) -> None:
    """The role's argument specs and preflight refuse them before any file is written."""
    refused, output = refused_variants(
        {name: overrides for name, (overrides, _) in BAD_VARIANTS.items()}, tmp_path)
    assert refused == set(BAD_VARIANTS), output[-6000:]
    for name, (_, message) in BAD_VARIANTS.items():
        assert message in output, (name, output[-6000:])
        assert not (tmp_path / name / "etc" / "alertmanager" / "alertmanager.yml").exists()


# --- inhibition, with a real Alertmanager ---------------------------------------------------

@pytest.fixture
def running_alertmanager(real_binaries: dict[str, str], tmp_path: Path,
                         configs: dict[str, Path]) -> Iterator[str]:
    with alertmanager(tmp_path, configs["remediation-off"]) as url:
        yield url


def _alert(name: str, **labels: str) -> dict:
    now = datetime.now(timezone.utc)
    return {"labels": {"alertname": name, **labels},
            "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=10)).isoformat()}


def test_inhibition_node_down_and_gpu_lost(running_alertmanager: str) -> None:
    url = running_alertmanager
    posted = [
        _alert("NodeDown", node="h1", severity="critical", component="node"),
        _alert("GpuTemperatureHigh", node="h1", gpu="0", severity="warning", component="gpu"),
        _alert("GpuExporterDown", node="h1", severity="warning", component="gpu"),
        _alert("TargetDown", node="h1", job="training", severity="warning", component="stack"),
        _alert("GpuTemperatureHigh", node="h2", gpu="0", severity="warning", component="gpu"),
        _alert("GpuLost", node="h2", gpu="1", severity="critical", component="gpu"),
        _alert("GpuUtilizationLowWhileTraining", node="h2", gpu="1", severity="warning",
               component="gpu"),
        _alert("GpuUtilizationLowWhileTraining", node="h2", gpu="0", severity="warning",
               component="gpu"),
        _alert("TrainingLossSpike", node="h1", training_job="llm", severity="warning",
               component="training"),
    ]
    response = requests.post(f"{url}/api/v2/alerts", json=posted, timeout=5)
    assert response.status_code == 200, response.text

    def key(alert: dict) -> tuple[str, str, str]:
        labels = alert["labels"]
        return labels["alertname"], labels["node"], labels.get("gpu", "")

    expected_inhibited = {
        ("GpuTemperatureHigh", "h1", "0"), ("GpuExporterDown", "h1", ""),
        ("TargetDown", "h1", ""), ("GpuUtilizationLowWhileTraining", "h2", "1"),
    }

    def settled() -> dict | None:
        got = requests.get(f"{url}/api/v2/alerts", timeout=5).json()
        state = {key(a): bool(a["status"]["inhibitedBy"]) for a in got}
        inhibited = {k for k, v in state.items() if v}
        return state if len(state) == len(posted) and inhibited == expected_inhibited else None

    try:
        state = wait_until(settled, timeout=20, what="inhibition to settle")
    except TimeoutError:
        got = requests.get(f"{url}/api/v2/alerts", timeout=5).json()
        pytest.fail(f"inhibition differs: {[(key(a), a['status']) for a in got]}")
    # the sources and the alerts of other nodes/GPUs/components stay active
    for active in [("NodeDown", "h1", ""), ("GpuLost", "h2", "1"),
                   ("GpuTemperatureHigh", "h2", "0"), ("GpuUtilizationLowWhileTraining", "h2", "0"),
                   ("TrainingLossSpike", "h1", "")]:
        assert state[active] is False, active
    not_inhibited = requests.get(f"{url}/api/v2/alerts", params={"inhibited": "false"},
                                 timeout=5).json()
    assert {key(a) for a in not_inhibited}.isdisjoint(expected_inhibited)
