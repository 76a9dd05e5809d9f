"""dcgm-exporter as the GPU source: the mapping uses dcgm-exporter's exact counter names, every
GPU alert has promtool cases with that source, and the Trainwatch source is unchanged.

The counter names are checked against dcgm-exporter's own etc/default-counters.csv, vendored
in tests/rules/fixtures/ with its source commit.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from alert_rules import gpu_source
from alert_rules.config import ConfigError, load_raw, resolve
from dashboards import promql_text
from tests.rules import promtool_cases
from tests.rules.rulefiles import (
    DCGM_COUNTERS_CSV,
    UNIT_TESTS,
    alerts_of,
    dcgm_counters_file,
    dcgm_field_names,
    exprs,
    rules,
)
from trainwatch.exporters.contract import catalog

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


# The labels dcgm-exporter writes on a GPU's series: its metrics template (gpuMetricsFormat in
# internal/pkg/rendermetrics/render_metrics.go, NVIDIA/dcgm-exporter at 1f7abdb7dc0f) writes
# gpu, UUID, pci_bus_id, device, modelName and Hostname, then one label per `label` row of the
# counters file: DCGM_FI_DRIVER_VERSION is the one the default file enables. Stated here from
# the upstream source, not read from alert_rules/gpu_source.py, so a wrong spelling there
# (issue 26: `hostname`, which dcgm-exporter never writes on a GPU series) fails this file.
DCGM_EXPORTER_GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                            "DCGM_FI_DRIVER_VERSION"}
SCRAPE_LABELS = {"job", "instance"}


def _dcgm_cases() -> list[dict]:
    return yaml.safe_load((UNIT_TESTS / "dcgm" / "gpu_test.yml").read_text())["tests"]


def test_the_mapping_reads_dcgm_exporters_label_names() -> None:
    assert set(gpu_source.DCGM_GPU_LABELS) | set(gpu_source.DCGM_DEFAULT_LABEL_FIELDS) \
        == DCGM_EXPORTER_GPU_LABELS
    assert enabled_label_rows() == set(gpu_source.DCGM_DEFAULT_LABEL_FIELDS)


def enabled_label_rows() -> set[str]:
    """The counters file's enabled `label` rows: labels dcgm-exporter adds to every series."""
    text = DCGM_COUNTERS_CSV.read_text()
    return set(re.findall(r"^(DCGM_\w+)\s*,\s*label\s*,", text, re.MULTILINE))


def test_promtool_inputs_carry_exactly_dcgm_exporters_labels() -> None:
    """Every dcgm-exporter series the promtool cases feed has the template's label set (plus
    the scrape's job and instance, and `node` where a case has Prometheus attach one)."""
    seen = 0
    for case in _dcgm_cases():
        for series in case.get("input_series") or []:
            text = series["series"]
            if not text.startswith("DCGM_"):
                continue
            names = set(re.findall(r"[{,](\w+)=", text))
            assert names - {"node"} == DCGM_EXPORTER_GPU_LABELS | SCRAPE_LABELS, text
            seen += 1
    assert seen > 20


def test_every_gpu_alert_from_dcgm_names_its_node() -> None:
    """With dcgm-exporter's real labels, every firing GPU alert of the promtool cases carries a
    `node` (the power-limit playbook's target and the NodeDown inhibition need it)."""
    gpu_alerts = set(alerts_of("dcgm", "gpu"))
    fired: set[str] = set()
    for case in _dcgm_cases():
        for check in case.get("alert_rule_test") or []:
            if check["alertname"] not in gpu_alerts:
                continue
            for exp in check.get("exp_alerts") or []:
                assert exp["exp_labels"].get("node"), (case["name"], check["alertname"])
                fired.add(check["alertname"])
    assert fired == gpu_alerts, gpu_alerts - fired


def _mapping(name: str) -> str:
    (rule,) = [r for group in gpu_source.groups(resolve(load_raw(), "dcgm"))
               for r in group.rules if r.name == name]
    return rule.expr


def test_unit_conversions_are_the_metric_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails on the mapping whose conversions were written by hand beside the table: each
    dcgm field's unit scale is its row's `dcgm_scale`, and a changed scale changes the rule."""
    assert " / 1000" in _mapping(catalog.GPU_ENERGY)
    assert " * 1e6" in _mapping(catalog.GPU_SM_CLOCK)
    energy = catalog.METRICS[catalog.GPU_ENERGY]
    monkeypatch.setitem(catalog.METRICS, catalog.GPU_ENERGY, energy._replace(dcgm_scale=1e-4))
    assert " / 10000" in _mapping(catalog.GPU_ENERGY)
    clock = catalog.METRICS[catalog.GPU_SM_CLOCK]
    monkeypatch.setitem(catalog.METRICS, catalog.GPU_SM_CLOCK, clock._replace(dcgm_scale=1.0))
    assert "*" not in _mapping(catalog.GPU_SM_CLOCK)


def test_the_mapping_needs_no_nvml_bindings() -> None:
    """The rule generator reads the clock-event bits and the GPM rows from the metric table:
    generating rules on a host without pynvml works (fails where it imported the reader)."""
    import subprocess
    import sys

    code = ("import sys; import alert_rules.gpu_source; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pynvml'))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60, cwd=root).stdout
    assert out.strip() == "[]"
