"""dcgm-exporter as the GPU source: the mapping uses dcgm-exporter's exact counter names, every
GPU alert has promtool cases with that source, and the Trainwatch source is unchanged.

The counter names are checked against dcgm-exporter's own etc/default-counters.csv, vendored
in tests/rules/fixtures/ with its source commit.
"""

from __future__ import annotations

import re

import pytest
import yaml

from alert_rules import gpu_source
from alert_rules.config import ConfigError, load_raw, resolve
from dashboards import promql_text
from exporters import catalog
from tests.rules import promtool_cases
from tests.rules.rulefiles import (
    UNIT_TESTS,
    alerts_of,
    dcgm_counters_file,
    dcgm_field_names,
    exprs,
    rules,
)

# a DCGM field the default file leaves out, which GpuThrottled needs (docs/adopt.md says so)
NOT_DEFAULT_BUT_NEEDED = {gpu_source.CLOCKS_EVENT_REASONS}


def dcgm_names(text: str) -> set[str]:
    return set(re.findall(r"\bDCGM_\w+", text))


def test_default_counters_in_the_mapping_are_enabled_in_dcgm_exporters_file() -> None:
    enabled, commented = dcgm_counters_file()
    assert set(gpu_source.DEFAULT_COUNTERS) <= enabled
    used = set().union(*(dcgm_names(e) for e in exprs("dcgm")))
    assert used <= dcgm_field_names(), used - dcgm_field_names()
    assert not set(gpu_source.NOT_IN_COUNTERS_FILE) & (enabled | commented)


def test_promtool_cases_are_fed_by_series_named_as_dcgm_exporter_names_them() -> None:
    enabled, _ = dcgm_counters_file()
    text = (UNIT_TESTS / "dcgm" / "gpu_test.yml").read_text()
    doc = yaml.safe_load(text)
    fed = set()
    for group in doc["tests"]:
        for series in group.get("input_series") or []:
            name = series["series"].split("{", 1)[0]
            if name.startswith("DCGM_"):
                fed.add(name)
            else:  # the training exporter's series (Trainwatch's own with either source)
                assert name == "up" or catalog.METRICS[name].exporter == "training", name
    assert fed - enabled == NOT_DEFAULT_BUT_NEEDED


def test_every_gpu_alert_has_firing_pending_and_not_firing_cases_with_dcgm() -> None:
    coverage = promtool_cases.classify_files([UNIT_TESTS / "dcgm" / "gpu_test.yml"])
    assert coverage.missing(alerts_of("dcgm", "gpu"), {}) == {}


def test_gpu_alerts_read_only_mapped_names_or_dcgm_counters() -> None:
    """With the dcgm source, no GPU alert may read a trainwatch_gpu_* name nobody records."""
    recorded = {r["record"] for r in rules("dcgm") if "record" in r}
    gpu_alerts = [r for r in rules("dcgm") if r.get("labels", {}).get("component") == "gpu"]
    for rule in gpu_alerts:
        for name in promql_text.metric_names(rule["expr"]):
            if name.startswith(catalog.GPU_PREFIX):
                assert name in recorded, (rule["alert"], name)


def test_trainwatch_source_adds_no_mapping_file() -> None:
    for profile in ("production", "demo"):
        assert not (UNIT_TESTS.parent / "generated" / profile / "gpu_source.yml").exists()
    assert (UNIT_TESTS.parent / "generated" / "dcgm" / "gpu_source.yml").exists()


def test_an_unknown_gpu_source_is_refused() -> None:
    raw = load_raw()
    raw["profiles"]["bad"] = {"gpu_source": "prometheus-magic"}
    with pytest.raises(ConfigError, match="gpu_source"):
        gpu_source.groups(resolve(raw, "bad"))
