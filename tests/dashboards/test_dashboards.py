"""Generated dashboards: no drift, linter rules pass, stable uids, variables.

Grafana's provisioning files come from the grafana role's templates (tests/ansible)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from dashboards import check, lint
from scripts import build
from tests.dashboards.dashboard_files import DASHBOARDS_DIR, load_all

EXPECTED_UIDS = {
    "gpu-fleet.json": "trainwatch-gpu-fleet",
    "gpu-node.json": "trainwatch-gpu-node",
    "training-job.json": "trainwatch-training-job",
    "remediation-alerts.json": "trainwatch-remediation-alerts",
    "stack-health.json": "trainwatch-stack-health",
    "goodput.json": "trainwatch-goodput",
}
COMMON_VARIABLES = {"datasource", "cluster", "job", "instance"}
EXTRA_VARIABLES = {
    "gpu-fleet.json": {"gpu"}, "gpu-node.json": {"gpu"},
    "training-job.json": {"training_job", "rank"},
    "goodput.json": {"training_job"},
}


def test_committed_files_match_the_generator() -> None:
    # generated/kubernetes/ (ConfigMaps) is checked in tests/rules/test_kubernetes.py
    tree = build.plan(only=["dashboards"])
    assert {p.name for p in tree.files} == set(EXPECTED_UIDS)
    assert tree.stale() == [], "run `python -m scripts.build`"


def test_uids_are_stable_and_unique() -> None:
    dashboards = load_all()
    assert {name: d["uid"] for name, d in dashboards.items()} == EXPECTED_UIDS
    for name, d in dashboards.items():
        ids = [p["id"] for p in check.panels(d)]
        assert ids == list(range(1, len(ids) + 1)), f"{name}: panel ids must be 1..n"


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_dashboard_passes_the_linter_rules(name: str) -> None:
    assert lint.lint(load_all()[name]) == {}


@pytest.mark.parametrize("name", sorted(EXPECTED_UIDS))
def test_dashboard_has_its_variables(name: str) -> None:
    variables = {v["name"] for v in load_all()[name]["templating"]["list"]}
    assert COMMON_VARIABLES | EXTRA_VARIABLES.get(name, set()) <= variables


def test_every_rate_uses_rate_interval_somewhere() -> None:
    """Each dashboard has rate()s and they all use $__rate_interval (the lint rule's subject)."""
    for name, d in load_all().items():
        exprs = [t["expr"] for p in check.panels(d) for t in p.get("targets", []) if "expr" in t]
        assert any("$__rate_interval" in e for e in exprs), name


# --- each linter rule catches what it is meant to catch -------------------------------------

Mutation = Callable[[dict], object]


def _broken(mutate: Mutation) -> dict:
    d = copy.deepcopy(load_all()["training-job.json"])
    mutate(d)
    return d


def _first_timeseries(d: dict) -> dict:
    return next(p for p in check.panels(d) if p["type"] == "timeseries")


def _set_expr(expr: str) -> Mutation:
    def mutate(d: dict) -> None:
        _first_timeseries(d)["targets"][0]["expr"] = expr
    return mutate


def _variable(d: dict, name: str) -> dict:
    return next(v for v in d["templating"]["list"] if v["name"] == name)


@pytest.mark.parametrize(("rule", "mutate"), [
    ("template-datasource-rule",
     lambda d: d["templating"]["list"].remove(_variable(d, "datasource"))),
    ("template-job-rule", lambda d: _variable(d, "job").update(allValue=".*")),
    ("template-job-rule", lambda d: _variable(d, "job").update(multi=False)),
    ("template-instance-rule",
     lambda d: _variable(d, "instance").update(datasource={"uid": "prometheus"})),
    ("template-instance-rule", lambda d: d["templating"]["list"].remove(_variable(d, "instance"))),
    ("target-rate-interval-rule", _set_expr("rate(training_samples_total[5m])")),
    ("target-counter-agg-rule", _set_expr("training_samples_total")),
    ("target-counter-agg-rule", _set_expr("sum(training_step_duration_seconds_count)")),
    ("panel-title-description-rule", lambda d: _first_timeseries(d).update(description="")),
    ("panel-units-rule", lambda d: _first_timeseries(d)["fieldConfig"]["defaults"].pop("unit")),
    ("panel-units-rule",
     lambda d: _first_timeseries(d)["fieldConfig"]["defaults"].update(unit="furlongs")),
])
def test_each_lint_rule_catches_its_problem(rule: str, mutate: Mutation) -> None:
    assert rule in lint.lint(_broken(mutate))


# --- helpers the end-to-end test reuses -----------------------------------------------------

def test_panel_queries_substitute_variables() -> None:
    d = load_all()["training-job.json"]
    queries = dict(check.panel_queries(d, {"training_job": "demo", "rank": "0|1"}))
    assert 'training_job=~"demo"' in queries["Loss per rank"]
    assert 'rank=~"0|1"' in queries["Loss per rank"]
    assert "[1m]" in queries["Throughput"] and "$" not in "".join(queries.values())


def test_substitute_refuses_unknown_variables() -> None:
    with pytest.raises(KeyError, match="nope"):
        check.substitute("up{job=~\"$nope\"}", {})


def test_failure_only_panels_exist_and_are_documented() -> None:
    by_uid = {d["uid"]: d for d in load_all().values()}
    readme = (DASHBOARDS_DIR / "README.md").read_text()
    for (uid, title), reason in check.FAILURE_ONLY.items():
        assert title in {p["title"] for p in check.panels(by_uid[uid])}, (uid, title)
        assert f"| {title} |" in readme and reason in readme, (uid, title)
