"""kube-prometheus-stack output: PrometheusRule objects valid against prometheus-operator's CRD
schema (vendored in tests/rules/fixtures/ with its source), holding the rule groups Prometheus
loads from alert_rules/generated/<profile>/ less the chart's own alerts, with no rule name of the
chart's (its list vendored beside the CRD) and absolute runbook URLs; dashboards as sidecar
ConfigMaps; the user overlay (alert_rules/overlay.py) over all of it (issue 26)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from alert_rules import kubernetes
from alert_rules import overlay as overlays
from alert_rules.config import ConfigError
from dashboards.generate import render_dashboards
from scripts import build
from tests.rules.rulefiles import GENERATED, PROFILES, rule_files, rules

CRD = Path(__file__).parent / "fixtures" / "prometheusrules-crd.yaml"
CHART_NAMES = Path(__file__).parent / "fixtures" / "kube-prometheus-stack-rule-names.txt"
COMMITTED = build.ROOT / build.RULE_OBJECTS_DIR
DASHBOARD_MAPS = build.ROOT / build.DASHBOARD_MAPS


def chart_rule_names() -> dict[str, set[str]]:
    """kube-prometheus-stack's alert and record names (the vendored list, with its source)."""
    out: dict[str, set[str]] = {"alert": set(), "record": set()}
    for line in CHART_NAMES.read_text().splitlines():
        if line and not line.startswith("#"):
            kind, name = line.split()
            out[kind].add(name)
    return out


def rule_names(groups: list[dict[str, Any]]) -> set[str]:
    return {r.get("alert") or r["record"] for g in groups for r in g["rules"]}


def crd_schema() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = version["schema"]["openAPIV3Schema"]
    _python_patterns(schema)
    jsonschema.Draft7Validator.check_schema(schema)
    return schema


def _python_patterns(node: object) -> None:
    """Go's RE2 (the API server's) takes `^(?i)...`; Python wants the flag first: `(?i)^...`.
    The same language otherwise for these patterns."""
    if isinstance(node, dict):
        pattern = node.get("pattern")
        if isinstance(pattern, str) and pattern.startswith("^(?i)"):
            node["pattern"] = "(?i)^" + pattern[len("^(?i)"):]
        for value in node.values():
            _python_patterns(value)
    elif isinstance(node, list):
        for value in node:
            _python_patterns(value)


def validate(obj: dict) -> None:
    """The API server's structural-schema check, as far as JSON Schema draft 7 expresses it
    (OpenAPI v3's `x-kubernetes-*` extensions are ignored)."""
    jsonschema.Draft7Validator(crd_schema()).validate(obj)


def committed(profile: str) -> dict:
    return yaml.safe_load((COMMITTED / f"{profile}-prometheusrule.yaml").read_text())


@pytest.mark.parametrize("profile", PROFILES)
def test_prometheus_rule_validates_against_the_operator_crd(profile: str) -> None:
    obj = committed(profile)
    validate(obj)
    assert (obj["apiVersion"], obj["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_schema_check_would_notice_a_broken_rule() -> None:
    obj = committed("production")
    obj["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate(obj)


@pytest.mark.parametrize("profile", PROFILES)
def test_rules_inside_equal_the_files_prometheus_loads(profile: str) -> None:
    """The same groups, less the chart's own alerts, with the runbook links made absolute."""
    loaded = [group for path in rule_files(profile)
              for group in yaml.safe_load(path.read_text())["groups"]]
    expected = kubernetes.without_chart_alerts(loaded)
    for group in expected:
        for rule in group["rules"]:
            if "alert" in rule:
                anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]
                rule["annotations"]["runbook_url"] = (
                    f"{kubernetes.PLACEHOLDER_RUNBOOK_BASE_URL}#{anchor}")
    assert sorted(committed(profile)["spec"]["groups"], key=lambda g: g["name"]) == sorted(
        expected, key=lambda g: g["name"])


def test_the_vendored_chart_list_holds_the_names_it_clashed_on() -> None:
    """The list is the chart's (a check that it was not cut short)."""
    chart = chart_rule_names()
    assert {"Watchdog", "TargetDown", "InfoInhibitor"} <= chart["alert"]
    assert "instance:node_memory_utilisation:ratio" in chart["record"]
    assert len(chart["alert"]) > 100 and len(chart["record"]) > 80


@pytest.mark.parametrize("profile", PROFILES)
def test_no_rule_of_the_kubernetes_objects_has_a_name_of_the_charts(profile: str) -> None:
    """Acceptance 2: neither an alert nor a recording rule of the PrometheusRule objects has
    the name of one of kube-prometheus-stack's (on the code before, Watchdog, TargetDown and
    instance:node_memory_utilisation:ratio did)."""
    chart = chart_rule_names()
    ours = rule_names(committed(profile)["spec"]["groups"])
    assert not ours & (chart["alert"] | chart["record"])
    # and the rule files a plain Prometheus loads beside node-mixin record none of its names
    records = {r["record"] for r in rules(profile) if "record" in r}
    assert not records & chart["record"]


@pytest.mark.parametrize("profile", PROFILES)
def test_runbook_urls_of_the_kubernetes_objects_are_absolute(profile: str) -> None:
    for group in committed(profile)["spec"]["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                url = rule["annotations"]["runbook_url"]
                assert url.startswith("https://"), url
                assert url.endswith(f"#{rule['alert'].lower()}"), url


def test_committed_objects_match_the_generator() -> None:
    tree = build.plan(only=["PrometheusRule objects", "dashboard ConfigMaps"])
    assert {p.name for p in tree.files} == {
        *(f"{p}-prometheusrule.yaml" for p in PROFILES), DASHBOARD_MAPS.name}
    assert tree.stale() == [], "run `python -m scripts.build`"


def test_namespace_and_release_are_dns_labels() -> None:
    obj = yaml.safe_load(kubernetes.render(namespace="ml-monitoring", release="prom")[
        "production-prometheusrule.yaml"])
    assert obj["metadata"]["namespace"] == "ml-monitoring"
    assert obj["metadata"]["labels"]["release"] == "prom"
    for bad in ({"namespace": "Bad_NS"}, {"release": "a;b"}, {"namespace": "x" * 64}):
        with pytest.raises(ConfigError, match="DNS label"):
            kubernetes.render(**bad)


def test_dashboards_as_sidecar_config_maps_hold_the_generated_json() -> None:
    maps = list(yaml.safe_load_all(DASHBOARD_MAPS.read_text()))
    rendered = render_dashboards()
    assert len(maps) == len(rendered)
    for cm in maps:
        assert cm["kind"] == "ConfigMap" and cm["apiVersion"] == "v1"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((filename, text),) = cm["data"].items()
        assert text == rendered[filename]
        assert json.loads(text)["uid"]


# --- the user overlay ---------------------------------------------------------------------

OVERLAY = {
    "runbook_base_url": "https://wiki.example.org/ml/trainwatch-runbooks",
    "selectors": {"gpu": 'job="nvidia-dcgm-exporter"'},
    "kubernetes": {"namespace": "ml-monitoring", "release": "kps", "name_prefix": "ml-tw",
                   "dashboard_label": {"example.org/dashboard": "yes"}},
    "receivers": {"deadman": {"webhook_configs": [{"url": "https://hb.example.org/ping"}]}},
}


def write_overlay(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def test_an_overlay_customises_rules_and_objects_without_touching_the_tree(
        tmp_path: Path, real_binaries: dict[str, str]) -> None:
    before = {p: p.read_text() for p in GENERATED.rglob("*.y*ml")}
    overlay = write_overlay(tmp_path / "overlay.yml", OVERLAY)
    built = tmp_path / "out"
    assert build.main(["--overlay", str(overlay), "--out", str(built)]) == 0
    assert {p: p.read_text() for p in GENERATED.rglob("*.y*ml")} == before
    out = built / build.RULES_DIR  # the same paths under --out as in the repository

    dcgm = yaml.safe_load((out / "kubernetes" / "dcgm-prometheusrule.yaml").read_text())
    validate(dcgm)
    meta = dcgm["metadata"]
    assert (meta["name"], meta["namespace"], meta["labels"]["release"]) == (
        "ml-tw-dcgm", "ml-monitoring", "kps")
    for path in [*out.glob("*/*.yml"), *out.glob("kubernetes/*.yaml")]:
        text = path.read_text()
        assert "docs/runbooks.md#" not in text and kubernetes.PLACEHOLDER_RUNBOOK_BASE_URL \
            not in text, path
    alerts = [r for g in dcgm["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert all(r["annotations"]["runbook_url"].startswith(OVERLAY["runbook_base_url"] + "#")
               for r in alerts)
    gpu_rules = (out / "dcgm" / "gpu_source.yml").read_text()
    assert 'job="nvidia-dcgm-exporter"' in gpu_rules and 'job="dcgm-exporter"' not in gpu_rules
    for profile in PROFILES:
        result = subprocess.run([real_binaries["promtool"], "check", "rules",
                                 *map(str, sorted((out / profile).glob("*.yml")))],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr

    assert yaml.safe_load((built / build.ALERTMANAGER_VARS).read_text()) == \
        overlays.ansible_vars(overlays.load(overlay))
    assert sorted(p.name for p in (built / build.DASHBOARDS_DIR).glob("*.json")) == sorted(
        render_dashboards())
    for cm in yaml.safe_load_all((built / build.DASHBOARD_MAPS).read_text()):
        assert cm["metadata"]["namespace"] == "ml-monitoring"
        assert cm["metadata"]["name"].startswith("ml-tw-dashboard-")
        assert cm["metadata"]["labels"]["example.org/dashboard"] == "yes"
        assert "grafana_dashboard" not in cm["metadata"]["labels"]


def test_the_overlay_is_read_from_the_environment(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(overlays.ENV, str(write_overlay(tmp_path / "o.yml", OVERLAY)))
    assert overlays.load(None).kubernetes.release == "kps"
    monkeypatch.delenv(overlays.ENV)
    assert overlays.load(None) == overlays.Overlay()


def test_an_overlay_never_writes_over_the_committed_defaults(tmp_path: Path) -> None:
    overlay = write_overlay(tmp_path / "overlay.yml", OVERLAY)
    before = {p: p.read_text() for p in GENERATED.rglob("*.y*ml")}
    assert build.main(["--overlay", str(overlay)]) == 2
    assert build.main(["--overlay", str(overlay), "--out", str(GENERATED / "x")]) == 2
    assert build.main(["--overlay", str(overlay), "--out", str(build.ROOT)]) == 2
    assert {p: p.read_text() for p in GENERATED.rglob("*.y*ml")} == before
    assert not (GENERATED / "x").exists()


BAD_OVERLAYS = {
    "relative runbook URL": ({"runbook_base_url": "docs/runbooks.md"}, "runbook_base_url"),
    "unknown key": ({"namespace": "x"}, "namespace"),
    "unknown selector": ({"selectors": {"gpus": 'job="x"'}}, "overlay.selectors.gpus"),
    "selector of the wrong type": ({"selectors": {"gpu": 3}}, "selectors.gpu"),
    "namespace not a DNS label": ({"kubernetes": {"namespace": "ML_mon"}}, "namespace"),
    "release with a space": ({"kubernetes": {"release": "a b"}}, "release"),
    "prefix too long": ({"kubernetes": {"name_prefix": "p" * 40}}, "name_prefix"),
    "unknown receiver": ({"receivers": {"pager": {}}}, "pager"),
    "not a mapping": (["runbook_base_url"], "top level"),
}


@pytest.mark.parametrize("case", BAD_OVERLAYS)
def test_a_bad_overlay_names_its_key_and_writes_nothing(
        tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    doc, key = BAD_OVERLAYS[case]
    overlay = write_overlay(tmp_path / "overlay.yml", doc)  # type: ignore[arg-type]
    out = tmp_path / "out"
    assert build.main(["--overlay", str(overlay), "--out", str(out)]) == 2
    assert key in capsys.readouterr().err
    assert not out.exists()


def test_load_reports_a_file_it_cannot_parse(tmp_path: Path) -> None:
    bad = tmp_path / "overlay.yml"
    bad.write_text("kubernetes: {namespace: [")
    with pytest.raises(ConfigError, match="cannot read the overlay"):
        overlays.load(bad)
