"""The Alertmanager template: valid for amtool, routes pinned per alert, inhibition real.

Routing is checked with `amtool config routes test --verify.receivers` against the config
rendered from alert_rules/alertmanager.yml.j2; inhibition with a real Alertmanager that gets
alerts through its v2 API.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests
import yaml

from alert_rules import alertmanager as am
from tests.rules.rulefiles import ROOT, alerts
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


def write_config(path: Path, overrides: dict | None = None) -> Path:
    path.write_text(am.render(overrides))
    return path


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


@pytest.mark.parametrize("overrides", [{}, CONFIGURED,
                                       {"alertmanager_remediation_enabled": False}],
                         ids=["defaults", "receivers-configured", "remediation-off"])
def test_rendered_config_passes_amtool_check_config(real_binaries: dict[str, str],
                                                    tmp_path: Path, overrides: dict) -> None:
    config = write_config(tmp_path / "alertmanager.yml", overrides)
    result = amtool(real_binaries, "check-config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_receivers_have_no_integrations() -> None:
    """Disabled until configured: nothing is sent to a made-up default address."""
    receivers = {r["name"]: r for r in yaml.safe_load(am.render())["receivers"]}
    for name in ("paging", "infra", "ml", "deadman"):
        assert set(receivers[name]) == {"name"}, receivers[name]
    hook = receivers["remediation"]["webhook_configs"][0]
    assert hook["http_config"]["authorization"]["credentials_file"].endswith(".token")
    assert hook["send_resolved"] is True  # gpu_power_limit restores on resolve


def test_receiver_bodies_are_passed_through_verbatim() -> None:
    receivers = {r["name"]: r for r in yaml.safe_load(am.render(CONFIGURED))["receivers"]}
    for name, body in CONFIGURED["alertmanager_receiver_configs"].items():
        assert {k: v for k, v in receivers[name].items() if k != "name"} == body


@pytest.mark.parametrize("remediation", [True, False], ids=["remediation-on", "remediation-off"])
def test_every_alert_reaches_its_pinned_receivers(real_binaries: dict[str, str], tmp_path: Path,
                                                  remediation: bool) -> None:
    config = write_config(tmp_path / "alertmanager.yml",
                          {"alertmanager_remediation_enabled": remediation})
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
def test_alert_classes_route_as_documented(real_binaries: dict[str, str], tmp_path: Path,
                                           labels: dict[str, str], receivers: str) -> None:
    config = write_config(tmp_path / "alertmanager.yml")
    result = amtool(real_binaries, "config", "routes", "test", f"--config.file={config}",
                    f"--verify.receivers={receivers}", *(f"{k}={v}" for k, v in labels.items()))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("overrides", "message"), [
    ({"alertmanager_remediation_enabled": "yes"}, "true or false"),
    ({"alertmanager_receiver_configs": {"pager": {}}}, "keys"),
    ({"alertmanager_receiver_configs": {"paging": "pagerduty"}}, "a mapping"),
    ({"alertmanager_smtp": "x"}, "unknown"),
])
def test_bad_variables_are_refused(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        am.render(overrides)


def test_cli_writes_a_private_file_and_refuses_bad_vars(tmp_path: Path) -> None:
    out = tmp_path / "alertmanager.yml"
    assert am.main(["--out", str(out)]) == 0
    assert stat.S_IMODE(os.stat(out).st_mode) & 0o007 == 0
    bad = tmp_path / "bad.yml"
    bad.write_text("alertmanager_remediation_enabled: maybe\n")
    target = tmp_path / "not-written.yml"
    assert am.main(["--vars", str(bad), "--out", str(target)]) == 2
    assert not target.exists()


# --- inhibition, with a real Alertmanager ---------------------------------------------------

@pytest.fixture
def running_alertmanager(real_binaries: dict[str, str], tmp_path: Path) -> Iterator[str]:
    config = write_config(tmp_path / "alertmanager.yml",
                          {"alertmanager_remediation_enabled": False})
    with alertmanager(tmp_path, config) as url:
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


@pytest.mark.parametrize("trim_blocks", [True, False])
def test_template_means_the_same_with_or_without_trim_blocks(trim_blocks: bool) -> None:
    """Ansible renders with trim_blocks on, a plain jinja2.Environment with it off; both must
    give the same configuration (only the `to_json` filter is needed besides plain Jinja2)."""
    import json

    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined,  # noqa: S701 - YAML, not HTML
                             trim_blocks=trim_blocks, keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    variables = {**am.defaults(), **CONFIGURED}
    text = env.from_string(am.TEMPLATE.read_text()).render(**variables)
    assert yaml.safe_load(text) == yaml.safe_load(am.render(CONFIGURED))


def test_ansible_role_defaults_mirror_the_template_defaults() -> None:
    """The alertmanager role documents the same defaults (URL and token path are templated
    from the inventory there, so only their presence is compared)."""
    role_defaults = ROOT / "ansible" / "roles" / "alertmanager" / "defaults" / "main.yml"
    role = yaml.safe_load(role_defaults.read_text())
    ours = am.defaults()
    for key, value in ours.items():
        assert key in role, f"{key} missing from {role_defaults}"
        if key not in {"alertmanager_remediation_url", "alertmanager_remediation_token_file"}:
            assert role[key] == value, key
