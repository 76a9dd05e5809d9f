"""kube-prometheus-stack output: PrometheusRule objects valid against prometheus-operator's CRD
schema (vendored in tests/rules/fixtures/ with its source), holding exactly the rule groups
Prometheus loads from alert_rules/generated/<profile>/; dashboards as sidecar ConfigMaps."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from alert_rules import kubernetes
from dashboards import kubernetes as dashboards_k8s
from dashboards.generate import render_dashboards
from tests.rules.rulefiles import PROFILES, rule_files

CRD = Path(__file__).parent / "fixtures" / "prometheusrules-crd.yaml"
COMMITTED = kubernetes.OUT_DIR


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
    loaded = [group for path in rule_files(profile)
              for group in yaml.safe_load(path.read_text())["groups"]]
    assert sorted(committed(profile)["spec"]["groups"], key=lambda g: g["name"]) == sorted(
        loaded, key=lambda g: g["name"])


def test_committed_objects_match_the_generator(tmp_path: Path) -> None:
    assert kubernetes.main(["--out", str(tmp_path)]) == 0
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*.yaml")}
    assert fresh == {p.name: p.read_text() for p in COMMITTED.glob("*.yaml")}
    assert dashboards_k8s.render() == dashboards_k8s.OUT_FILE.read_text(), (
        "run `python -m dashboards.generate`")


def test_namespace_and_release_are_dns_labels_and_bad_ones_write_nothing(
        tmp_path: Path) -> None:
    assert kubernetes.main(["--out", str(tmp_path / "a"), "--namespace", "ml-monitoring",
                            "--release", "prom"]) == 0
    obj = yaml.safe_load((tmp_path / "a" / "production-prometheusrule.yaml").read_text())
    assert obj["metadata"]["namespace"] == "ml-monitoring"
    assert obj["metadata"]["labels"]["release"] == "prom"
    for bad in (["--namespace", "Bad_NS"], ["--release", "a;b"], ["--namespace", "x" * 64]):
        assert kubernetes.main(["--out", str(tmp_path / "b"), *bad]) == 2
    assert not (tmp_path / "b").exists()


def test_dashboards_as_sidecar_config_maps_hold_the_generated_json() -> None:
    maps = list(yaml.safe_load_all(dashboards_k8s.OUT_FILE.read_text()))
    rendered = render_dashboards()
    assert len(maps) == len(rendered)
    for cm in maps:
        assert cm["kind"] == "ConfigMap" and cm["apiVersion"] == "v1"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((filename, text),) = cm["data"].items()
        assert text == rendered[filename]
        assert json.loads(text)["uid"]
