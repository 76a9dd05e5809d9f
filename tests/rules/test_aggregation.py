"""The per-job / per-node recordings (aggregate_per_job_and_node) change what the alerts read,
not when they fire: every promtool unit test of every profile passes on the rules generated
with the aggregation and on the same rules generated without it (the alerts reading every
rank's and GPU's series, as before), and with it the per-rank reads are gone from the alerts
that now read per-job or per-node series."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from alert_rules import generate
from alert_rules.config import CONFIG_PATH, load_raw, resolve
from tests.rules.rulefiles import PROFILES

UNIT_TESTS = Path(__file__).resolve().parents[2] / "alert_rules" / "tests"


def _rules(profile: str, aggregate: bool) -> dict[str, str]:
    raw = load_raw(CONFIG_PATH)
    raw["defaults"]["aggregate_per_job_and_node"] = aggregate
    return generate.render(resolve(raw, profile))


@pytest.mark.parametrize("profile", PROFILES)
def test_unit_tests_pass_with_and_without_aggregation(real_binaries: dict[str, str],
                                                      tmp_path: Path, profile: str) -> None:
    cases = sorted((UNIT_TESTS / profile).glob("*_test.yml"))
    if not cases:
        pytest.skip(f"no promtool unit tests for {profile}")
    for aggregate in (True, False):
        out = tmp_path / str(aggregate) / "generated"
        generate.write(out, {profile: _rules(profile, aggregate)})
        tests = tmp_path / str(aggregate) / "tests" / profile
        tests.mkdir(parents=True)
        for case in cases:  # same relative rule_files layout as alert_rules/tests
            (tests / case.name).write_text(case.read_text())
        for case in cases:
            result = subprocess.run([real_binaries["promtool"], "test", "rules", case.name],
                                    cwd=tests, capture_output=True, text=True, check=False)
            assert result.returncode == 0, (f"aggregate={aggregate} {case.name}:\n"
                                            + result.stdout[-3000:] + result.stderr[-2000:])


def test_aggregated_alerts_read_per_job_and_per_node_series() -> None:
    def by_name(aggregate: bool) -> dict[str, str]:
        return {r.get("alert") or r["record"]: r["expr"]
                for text in _rules("production", aggregate).values()
                for g in yaml.safe_load(text)["groups"] for r in g["rules"]}

    flat, aggregated = by_name(False), by_name(True)
    assert "max by (training_job) (training_collective_sequence" in flat[
        "training_job_rank:training_progress:stall_suspect"]
    suspect = aggregated["training_job_rank:training_progress:stall_suspect"]
    assert "max by" not in suspect and "min by" not in suspect
    assert "training_job:training_collective_sequence:max" in suspect
    assert "max_over_time(training_job_instance:training_heartbeat_timestamp_seconds:max[1h])" \
        in aggregated["TrainingJobVanished"]
    assert "changes(training_step" not in aggregated["GpuUtilizationLowWhileTraining"]
    assert "instance:training_step:stepping_ranks" in aggregated["GpuUtilizationLowWhileTraining"]
    # the default, what the committed files hold
    assert load_raw(CONFIG_PATH)["defaults"]["aggregate_per_job_and_node"] is True
