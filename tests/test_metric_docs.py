"""The docs' metric and alert tables are what scripts/metric_docs.py derives from the metric
table (exporters/contract/catalog.py) and alert_rules/config.yml."""

from __future__ import annotations

import pytest

from scripts import build, metric_docs


def test_generated_doc_sections_are_current() -> None:
    assert build.plan(only=["metric and alert tables"]).stale() == [], (
        "run: python -m scripts.build")


def test_a_section_is_rewritten_from_the_source() -> None:
    text = "a\n<!-- generated: alerts -->\nold\n<!-- end generated: alerts -->\nb\n"
    out = metric_docs.render(text, "alerts", metric_docs.alert_names())
    assert "old" not in out and "`GpuTemperatureHigh`" in out and out.endswith("-->\nb\n")


def test_a_page_without_the_section_is_an_error() -> None:
    with pytest.raises(ValueError, match="gpu-metrics"):
        metric_docs.render("no markers\n", "gpu-metrics", "x")
