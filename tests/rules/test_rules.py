"""Alert and recording rules: generated from config, valid for promtool, unit-tested, complete."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from alert_rules.config import ConfigError, load_profiles, load_raw, resolve
from scripts import build
from tests.rules import promtool_cases
from tests.rules.rulefiles import (
    CONFIG_ALERTS,
    GENERATED,
    PROFILES,
    RULES_DIR,
    UNIT_TESTS,
    alerts,
    rule_files,
    rules,
)

UNIT_TEST_FILES = sorted(UNIT_TESTS.glob("*/*_test.yml"))
# Watchdog has no `for` and fires by design at every moment: only its firing case exists.
EXEMPT = {"Watchdog": {promtool_cases.PENDING, promtool_cases.NOT_FIRING}}


def test_committed_rules_match_the_generator() -> None:
    tree = build.plan(only=["alert rules"])
    assert {p.parent.name for p in tree.files} == set(PROFILES)
    assert tree.stale() == [], "run `python -m scripts.build`"


@pytest.mark.parametrize("profile", PROFILES)
def test_promtool_check_rules(real_binaries: dict[str, str], profile: str) -> None:
    result = subprocess.run([real_binaries["promtool"], "check", "rules",
                             *map(str, rule_files(profile))], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass(real_binaries: dict[str, str]) -> None:
    assert UNIT_TEST_FILES, "no promtool unit tests found"
    failures = []
    for path in UNIT_TEST_FILES:  # one file per call: promtool resolves rule_files per file dir
        result = subprocess.run([real_binaries["promtool"], "test", "rules", path.name],
                                cwd=path.parent, capture_output=True, text=True)
        if result.returncode != 0:
            failures.append(f"{path.relative_to(RULES_DIR)}:\n{result.stdout}{result.stderr}")
    assert not failures, "\n".join(failures)


def test_every_alert_has_a_firing_a_pending_and_a_not_firing_case() -> None:
    production_tests = [p for p in UNIT_TEST_FILES if p.parent.name == "production"]
    coverage = promtool_cases.classify_files(production_tests)
    missing = coverage.missing(sorted(alerts("production")), EXEMPT)
    assert not missing, f"alerts lacking promtool test cases: {missing}"


def test_coverage_check_notices_a_missing_case() -> None:
    doc = {"tests": [{"alert_rule_test": [
        {"alertname": "GpuLost", "eval_time": "5m", "exp_alerts": [{"exp_labels": {}}]},
        {"alertname": "GpuLost", "eval_time": "1m"},  # no pending proof at 1m: not-firing only
    ]}]}
    coverage = promtool_cases.classify(doc)
    assert coverage.missing(["GpuLost"], {}) == {"GpuLost": [promtool_cases.PENDING]}


@pytest.mark.parametrize("profile", PROFILES)
def test_alerts_are_exactly_the_catalog(profile: str) -> None:
    assert sorted(alerts(profile)) == sorted(CONFIG_ALERTS)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_alert_is_labelled_and_annotated(profile: str) -> None:
    for name, rule in alerts(profile).items():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert rule["labels"]["component"] in {"gpu", "training", "node", "stack"}, name
        notes = rule["annotations"]
        assert notes["summary"], name
        assert len(notes["description"]) > 80, f"{name}: description too thin for on-call"
        assert notes["runbook_url"].endswith(f"#{name.lower()}"), name
        if name != "Watchdog":
            assert rule.get("for"), f"{name} needs a `for` so one bad scrape cannot page"


def test_rendered_summaries_fit_a_phone_notification() -> None:
    for path in UNIT_TEST_FILES:
        for group in yaml.safe_load(path.read_text())["tests"]:
            for case in group.get("alert_rule_test") or []:
                for alert in case.get("exp_alerts") or []:
                    summary = alert.get("exp_annotations", {}).get("summary", "")
                    assert len(summary) <= 100, (path.name, summary)


def test_recording_rules_follow_level_metric_operations() -> None:
    for rule in rules("production"):
        if "record" in rule:
            assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z_]+", rule["record"]), rule["record"]


def test_nonfinite_loss_is_short_and_sticky() -> None:
    rule = alerts("production")["TrainingNonFiniteLoss"]
    assert rule["for"] in {"15s", "30s", "1m"}
    assert rule["keep_firing_for"]


def test_demo_profile_uses_seconds() -> None:
    for name, rule in alerts("demo").items():
        if "for" in rule:
            assert re.fullmatch(r"[0-9]+s", rule["for"]), f"demo {name}: for {rule['for']}"
            assert int(rule["for"][:-1]) <= 10, f"demo {name}: for {rule['for']} too slow"
    # the spike baseline (recorded for the alert) uses the demo's seconds too
    baseline = next(r for r in rules("demo")
                    if r.get("record") == "training_job_rank:training_loss:baseline_mean")
    assert "[20s] offset 3s" in baseline["expr"]
    # and every group of slow-moving recordings runs at the demo's 1 s
    for path in rule_files("demo"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            assert group.get("interval", "1s") == "1s", f"demo {group['name']}"


def test_training_alerts_keep_the_training_job_label() -> None:
    """The remediation service targets a job by this label; every firing case proves it."""
    training = {n for n, r in alerts("production").items()
                if r["labels"]["component"] == "training"}
    for path in UNIT_TEST_FILES:
        for group in yaml.safe_load(path.read_text())["tests"]:
            for case in group.get("alert_rule_test") or []:
                if case["alertname"] in training:
                    for alert in case.get("exp_alerts") or []:
                        assert alert["exp_labels"].get("training_job"), (path.name, case)


@pytest.mark.parametrize(("override", "message"), [
    ({"alerts": {"GpuLost": {"fore": "1m"}}}, "profiles.bad.alerts.GpuLost.fore: unknown key"),
    ({"alerts": {"GpuLost": {"for": "soon"}}}, "not a Prometheus duration"),
    ({"alerts": {"GpuTemperatureHigh": {"threshold_celsius": "hot"}}}, "expected int"),
    ({"nonsense": 1}, "unknown key"),
])
def test_bad_config_is_refused(tmp_path: Path, override: dict, message: str) -> None:
    """(The build renders every file before it writes one: tests/test_build.py.)"""
    raw = load_raw()
    raw["profiles"]["bad"] = override
    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_profiles(config)


def test_profiles_only_change_what_they_name() -> None:
    raw = load_raw()
    production, demo = resolve(raw, "production"), resolve(raw, "demo")
    gpu_temp = ("alerts", "GpuTemperatureHigh")
    assert production.values[gpu_temp[0]][gpu_temp[1]]["threshold_celsius"] == \
        demo.values[gpu_temp[0]][gpu_temp[1]]["threshold_celsius"]
    assert demo.values["selectors"] == production.values["selectors"]
    assert GENERATED.is_dir()


def test_refresh_annotations_restores_the_snapshots(real_binaries: dict[str, str],
                                                     tmp_path: Path) -> None:
    from alert_rules import refresh_annotations

    (tmp_path / "generated").symlink_to(GENERATED)
    original = UNIT_TESTS / "production" / "stack_test.yml"
    copy = tmp_path / "tests" / "production" / original.name
    copy.parent.mkdir(parents=True)
    stripped = "\n".join(refresh_annotations._strip(original.read_text().splitlines())) + "\n"
    copy.write_text(stripped)
    assert refresh_annotations.main([str(copy)]) == 0
    assert copy.read_text() == original.read_text()
