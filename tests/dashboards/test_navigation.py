"""Issue 26: the dashboards as on-call uses them. Every dashboard links to the others (a
drop-down of the `trainwatch` tag, keeping time range and variables); FLOP/s panels are in
Grafana's FLOP/s unit; per-rank panels of a large job draw `$ranks_shown` ranks, the ones
that matter (topk of loss and step time, bottomk of FLOP/s), not every rank. On the code
before there were no links, FLOP/s were `short`, a 1,024-rank job drew 1,024 lines, and no
panel read the provisioned Elasticsearch logs."""

from __future__ import annotations

import re

from dashboards import check
from dashboards.panels import RANKS_SHOWN, RANKS_SHOWN_DEFAULT, TAG
from tests.dashboards.dashboard_files import load_all

TRAINING = "training-job.json"
# panels with one series per rank that stay whole: counters of rare events (few ranks have
# one) and the stat panels
PER_RANK_KEPT = {"Learning rate", "Non-finite losses", "Log events", "CUDA memory",
                 "Commands applied and rollbacks", "Dropped step reports"}


def test_every_dashboard_links_to_every_other() -> None:
    dashboards = load_all()
    for name, doc in dashboards.items():
        assert TAG in doc["tags"], name
        (link,) = doc["links"]
        assert (link["type"], link["tags"], link["asDropdown"]) == ("dashboards", [TAG], True)
        assert link["keepTime"] and link["includeVars"], name


def test_flops_panels_use_grafanas_flops_unit() -> None:
    flops = [p for doc in load_all().values() for p in check.panels(doc)
             if "FLOP/s" in p.get("title", "")]
    assert flops
    for panel in flops:
        assert panel["fieldConfig"]["defaults"]["unit"] == "flops", panel["title"]


def test_per_rank_panels_draw_the_ranks_that_matter() -> None:
    doc = load_all()[TRAINING]
    (variable,) = [v for v in doc["templating"]["list"] if v["name"] == RANKS_SHOWN]
    assert variable["current"]["value"] == RANKS_SHOWN_DEFAULT
    cut = 0
    for panel in check.panels(doc):
        if panel.get("type") != "timeseries" or panel["title"] in PER_RANK_KEPT:
            continue
        for target in panel["targets"]:
            if "{{rank}}" in target.get("legendFormat", ""):
                assert re.match(rf"(top|bottom)k\(\${RANKS_SHOWN}, ", target["expr"]), (
                    panel["title"], target["expr"])
                cut += 1
    assert cut >= 7
    flops = [t["expr"] for p in check.panels(doc) for t in p.get("targets", []) if "expr" in t
             if "FLOP/s" in p["title"]]
    assert all(e.startswith("bottomk(") for e in flops)  # the slow ranks, not the fast ones
    queries = dict(check.panel_queries(doc))
    assert queries["Loss per rank"].startswith(f"topk({RANKS_SHOWN_DEFAULT}, ")


def test_the_training_dashboard_shows_the_ranks_logs() -> None:
    """The Elasticsearch data source the grafana role provisions had no panel reading it."""
    doc = load_all()[TRAINING]
    (panel,) = [p for p in check.panels(doc) if p.get("type") == "logs"]
    assert panel["datasource"] == {"type": "elasticsearch", "uid": "${elasticsearch_datasource}"}
    (target,) = panel["targets"]
    assert target["metrics"] == [{"type": "logs", "id": "1"}]
    assert "labels.training_job:${training_job:lucene}" in target["query"]
    (variable,) = [v for v in doc["templating"]["list"]
                   if v["name"] == "elasticsearch_datasource"]
    assert (variable["type"], variable["query"]) == ("datasource", "elasticsearch")
