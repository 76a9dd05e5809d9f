"""The per-job / per-node recordings (aggregate_per_job_and_node) change what the alerts read,
not when they fire: every promtool unit test of every profile passes on the rules generated
with the aggregation and on the same rules generated without it (the alerts reading every
rank's and GPU's series, as before), and with it the per-rank reads are gone from the alerts
that now read per-job or per-node series.

With the aggregation, slow-moving recordings run in groups with their own `interval`
(slow_interval, 1m in production). Prometheus runs groups independently, so an alert in
another group may read such a recording one slow_interval old. promtool evaluates every group
at every evaluation_interval in `group_eval_order`; putting the slow groups last makes every
alert read the slow recordings one round late, which for the production tests (1m rounds) is
the production worst case: every alert of every unit test still fires at the same evaluation
with the same labels (a description quoting a value may quote one a round older)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from alert_rules import generate
from alert_rules.config import CONFIG_PATH, load_raw, resolve, seconds
from tests.rules.rulefiles import PROFILES
from trainwatch.exporters.node.training.collector import (
    STALL_EVIDENCE_MIN_IDLE_SECONDS,
    STALL_EVIDENCE_STEP_FACTOR,
)

UNIT_TESTS = Path(__file__).resolve().parents[2] / "alert_rules" / "tests"


def _rules(profile: str, aggregate: bool) -> dict[str, str]:
    raw = load_raw(CONFIG_PATH)
    raw["defaults"]["aggregate_per_job_and_node"] = aggregate
    return generate.render(resolve(raw, profile))


def _groups(rendered: dict[str, str]) -> list[dict]:
    return [g for text in rendered.values() for g in yaml.safe_load(text)["groups"]]


def _run_unit_tests(promtool: str, root: Path, profile: str, rendered: dict[str, str],
                    slow_last: bool = False) -> None:
    """Every promtool unit test of `profile` against `rendered`, in the committed tests'
    layout under `root`; with slow_last, the groups with their own interval are evaluated
    after all others."""
    cases = sorted((UNIT_TESTS / profile).glob("*_test.yml"))
    if not cases:
        pytest.skip(f"no promtool unit tests for {profile}")
    if slow_last:
        rendered = {name: _strip_annotations(text) for name, text in rendered.items()}
    (root / "generated" / profile).mkdir(parents=True)
    for name, text in rendered.items():
        (root / "generated" / profile / name).write_text(text)
    tests = root / "tests" / profile
    tests.mkdir(parents=True)
    slow = [g["name"] for g in _groups(rendered) if "interval" in g]
    others = [g["name"] for g in _groups(rendered) if "interval" not in g]
    for case in cases:  # same relative rule_files layout as alert_rules/tests
        doc = yaml.safe_load(case.read_text())
        if slow_last:
            doc["group_eval_order"] = [*others, *slow]
            _without_annotations(doc)
        (tests / case.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    for case in cases:
        result = subprocess.run([promtool, "test", "rules", case.name], cwd=tests,
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, (f"{root.name} {case.name}:\n"
                                        + result.stdout[-3000:] + result.stderr[-2000:])


def _strip_annotations(text: str) -> str:
    """The rule file without alert annotations: a baseline one round older moves the value a
    description quotes (a loss 2.99 instead of 3 above its mean), not when or for which
    labels an alert fires, which is what the one-round-late run compares."""
    doc = yaml.safe_load(text)
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return yaml.safe_dump(doc, sort_keys=False)


def _without_annotations(doc: dict) -> None:
    for group in doc.get("tests", []):
        for case in group.get("alert_rule_test", []):
            for alert in case.get("exp_alerts") or []:
                alert.pop("exp_annotations", None)


@pytest.mark.parametrize("profile", PROFILES)
def test_unit_tests_pass_with_and_without_aggregation(real_binaries: dict[str, str],
                                                      tmp_path: Path, profile: str) -> None:
    for aggregate in (True, False):
        _run_unit_tests(real_binaries["promtool"], tmp_path / f"aggregate-{aggregate}",
                        profile, _rules(profile, aggregate))


@pytest.mark.parametrize("profile", PROFILES)
def test_unit_tests_pass_with_the_slow_recordings_one_round_late(
        real_binaries: dict[str, str], tmp_path: Path, profile: str) -> None:
    rendered = _rules(profile, True)
    assert any("interval" in g for g in _groups(rendered))
    _run_unit_tests(real_binaries["promtool"], tmp_path / "slow-last", profile, rendered,
                    slow_last=True)


def _reads(expr: str, name: str) -> bool:
    return re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", expr) is not None


def test_committed_unit_tests_order_recording_groups_before_their_readers() -> None:
    """promtool orders groups not named in group_eval_order at random: every test file whose
    groups read another group's recordings names the recording group first, so the committed
    tests check the same-round semantics every time."""
    for case in sorted(UNIT_TESTS.glob("*/*_test.yml")):
        doc = yaml.safe_load(case.read_text())
        groups = [g for f in doc["rule_files"]
                  for g in yaml.safe_load((case.parent / f).read_text())["groups"]]
        records = {g["name"]: {r["record"] for r in g["rules"] if "record" in r} for g in groups}
        order = doc.get("group_eval_order", [])
        for reader in groups:
            for writer, names in records.items():
                if writer != reader["name"] and any(
                        _reads(r["expr"], n) for r in reader["rules"] for n in names):
                    assert writer in order and reader["name"] in order, (
                        f"{case.name}: {reader['name']} reads {writer}: name both in "
                        "group_eval_order")
                    assert order.index(writer) < order.index(reader["name"]), case.name


def test_aggregated_alerts_read_per_job_and_per_node_series() -> None:
    def by_name(aggregate: bool) -> dict[str, str]:
        return {r.get("alert") or r["record"]: r["expr"]
                for text in _rules("production", aggregate).values()
                for g in yaml.safe_load(text)["groups"] for r in g["rules"]}

    flat, aggregated = by_name(False), by_name(True)
    assert "max by (training_job) ((training_collective_sequence" in flat[
        "training_job_rank:training_progress:stall_suspect"]
    # no rank's own series is read every round: the stall evidence the exporters expose only
    # while a job's ranks stop stepping, narrowed to the stalled jobs before anything else;
    # the job's max / min and the priorities read only that (normally empty) recording; the
    # job's progress and liveness come from one series per job and node
    inputs = aggregated["training_job_rank:training_progress:stalled_inputs"]
    # (less the ranks of a launch of the job older than its newest that an exporter still
    # serves, without the launch's id)
    assert inputs == ('max without (incarnation) (\n  training_stall_evidence{job="training"}\n'
                      "  and on (training_job)\n  training_job:training_progress:stalled\n"
                      "  unless on (training_job, instance)\n"
                      "  training_job_instance:training_stall_evidence:superseded\n)")
    stall = [expr for name, expr in aggregated.items() if "progress" in name
             or "heartbeat" in name or name in ("TrainingStalled", "TrainingJobVanished")]
    for metric in ("training_collective_sequence", "training_step",
                   "training_heartbeat_timestamp_seconds",
                   "training_last_step_timestamp_seconds"):
        assert not any(f"{metric}{{" in expr for expr in stall), metric
        assert any(f"{metric}{{" in expr for expr in flat.values()), metric
    assert "training_job:training_collective_sequence:max" not in aggregated
    assert "training_job_rank:training_progress:stall_priority" in aggregated[
        "training_job_rank:training_progress:stall_suspect"]
    assert 'max_over_time(training_node_heartbeat_timestamp_seconds{job="training"}[1h])' \
        in aggregated["TrainingJobVanished"]
    assert "training_node_last_step_timestamp_seconds" in aggregated[
        "training_job:training_progress:age_seconds"]
    # a GPU's flag that exists only while it is lost, not every GPU's `up`
    assert "trainwatch_gpu_lost{" in aggregated["GpuLost"]
    assert "trainwatch_gpu_up{" not in aggregated["GpuLost"]
    assert "trainwatch_gpu_up{" in flat["GpuLost"]
    assert "changes(training_step" not in aggregated["GpuUtilizationLowWhileTraining"]
    assert "instance:training_progress:stepping_jobs" in aggregated[
        "GpuUtilizationLowWhileTraining"]
    assert "training_job:training_progress:age_seconds" in aggregated["TrainingThroughputDrop"]
    assert "changes(training_step" not in aggregated["TrainingThroughputDrop"]
    # the spike alerts compare this round's value with recorded per-rank thresholds
    for alert, metric in (("TrainingLossSpike", "training_loss"),
                          ("TrainingGradNormExplosion", "training_grad_norm")):
        assert f"avg_over_time({metric}{{" in flat[alert]
        assert f"_over_time({metric}{{" not in aggregated[alert]
    # a non-finite loss is the counter's alone: the exporter serves no NaN in the loss gauge
    # (catalog `finite`), so either way there is nothing to read there
    for rules in (aggregated, flat):
        assert "training_loss{" not in rules["TrainingNonFiniteLoss"]
        assert "training_nonfinite_loss_total{" in rules["TrainingNonFiniteLoss"]
    # the default, what the committed files hold
    assert load_raw(CONFIG_PATH)["defaults"]["aggregate_per_job_and_node"] is True


def test_slow_groups_hold_recordings_and_only_alerts_with_a_long_for() -> None:
    """Recordings move to the slow groups; alerts whose `for` is at least slow_alerts_min_for
    go to the slow_interval groups and those with at least medium_alerts_min_for to the
    medium_interval ones (either way they fire up to interval - 15 s later, at most 15 % of
    their `for`); every other alert stays at the global interval, where its `for` is
    counted."""
    defaults = load_raw(CONFIG_PATH)["defaults"]
    global_s = 15.0
    tiers = {defaults["slow_interval"]: seconds(defaults["slow_alerts_min_for"]),
             defaults["medium_interval"]: seconds(defaults["medium_alerts_min_for"])}
    for interval, min_for in tiers.items():  # the delay is a small part of the `for`
        assert seconds(interval) - global_s <= 0.15 * min_for, interval
    groups = _groups(_rules("production", True))
    timed = [g for g in groups if "interval" in g]
    every = defaults["alerts"]["TrainingStalled"]["step_time_every"]
    baseline_every = defaults["baseline_every"]
    assert {g["interval"] for g in timed} == {*tiers, every, baseline_every}
    # the job's median step time (every rank's 8 buckets) and the spike alerts' 30-minute
    # baselines at their own, longer intervals; their readers take the newest value within
    # two intervals
    longer = {every, baseline_every}
    assert sorted(r.get("record") for g in timed if g["interval"] in longer
                  for r in g["rules"]) == [
        "training_job:training_step_duration_seconds:median",
        "training_job_rank:training_grad_norm:explosion_threshold",
        "training_job_rank:training_loss:baseline_mean"]
    readers = {r.get("alert") or r.get("record"): r["expr"] for g in groups for r in g["rules"]}
    assert "last_over_time(training_job_rank:training_loss:baseline_mean[10m])" in readers[
        "TrainingLossSpike"]
    assert "last_over_time(training_job_rank:training_grad_norm:explosion_threshold[10m])" \
        in readers["TrainingGradNormExplosion"]
    threshold = next(r["expr"] for g in groups for r in g["rules"] if r.get("record") ==
                     "training_job:training_progress:stall_threshold_seconds")
    assert "last_over_time(training_job:training_step_duration_seconds:median[10m])" \
        in threshold
    by_interval: dict[str | None, dict[str, float]] = {}
    for g in groups:
        for r in g["rules"]:
            if "alert" in r:
                by_interval.setdefault(g.get("interval"), {})[r["alert"]] = (
                    seconds(r["for"]) if "for" in r else 0.0)
    slow, medium = (by_interval[i] for i in tiers)
    assert {"GpuThrottled", "GpuMemoryNearlyFull", "GpuUtilizationLowWhileTraining",
            "TrainingThroughputDrop", "NodeDiskFillingPredicted"} <= set(slow)
    # TrainingStragglerRank: for 2m, so a 20% straggler is named within 5 minutes (issue 28)
    assert {"TrainingLossSpike", "TrainingGradNormExplosion", "NodeDown",
            "TrainingStragglerRank"} <= set(medium)
    slow_min, medium_min = tiers.values()
    assert all(f >= slow_min for f in slow.values())
    assert all(medium_min <= f < slow_min for f in medium.values())
    assert all(f < medium_min for f in by_interval[None].values())
    # the short, paging ones stay at 15 s
    assert {"TrainingNonFiniteLoss", "TrainingStalled", "GpuEccUncorrectableErrors",
            "GpuLost", "TrainingJobVanished"} <= set(by_interval[None])
    assert not any("interval" in g for g in _groups(_rules("production", False)))


@pytest.mark.parametrize("profile", PROFILES)
def test_stall_evidence_is_exposed_before_any_profile_can_call_a_job_stalled(
        profile: str) -> None:
    """The exporters expose a rank's stall evidence once its job's ranks on the node have gone
    max(STALL_EVIDENCE_MIN_IDLE_SECONDS, STALL_EVIDENCE_STEP_FACTOR x their newest step time)
    without a step; a profile calls a job stalled after max(step_time_factor x its median
    step time, floor_seconds). The evidence must come first, with a scrape and an evaluation
    to spare (the demo scrapes every second, production every 15 s)."""
    cfg = resolve(load_raw(CONFIG_PATH), profile)
    stalled = cfg.alert("TrainingStalled")
    interval = 1 if profile == "demo" else 15
    assert stalled["floor_seconds"] >= STALL_EVIDENCE_MIN_IDLE_SECONDS + 2 * interval
    # a rank's newest step may take twice the job's median before its evidence comes late
    assert stalled["step_time_factor"] >= 2 * STALL_EVIDENCE_STEP_FACTOR

