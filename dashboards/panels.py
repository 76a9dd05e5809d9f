"""Small, typed helpers over grafana-foundation-sdk so every panel is built the same way.

Each helper takes a title, a description and a unit as required arguments: the dashboard
linter rules (panel-title-description-rule, panel-units-rule) then hold by construction, and
the tests check the generated JSON as well. Queries always use the `$datasource` variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import elasticsearch, logs, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
ALL_REGEX = ".+"  # what the linter wants as allValue for job/instance
ANY_REGEX = ".*"  # for labels a series may lack (cluster on single-cluster setups)
# The selectors of the scope variables (with_scope_variables), for the dashboards' queries.
CLUSTER = 'cluster=~"$cluster"'
SCOPE = f'{CLUSTER},job=~"$job",instance=~"$instance"'
PanelT = TypeVar("PanelT", timeseries.Panel, stat.Panel, table.Panel)


@dataclass(frozen=True)
class Q:
    """One PromQL target of a panel."""

    expr: str
    legend: str = ""


def gpus_with_errors(counter: str) -> str:
    """How many GPUs serve `counter` (a selector) at all, 0 when none do.

    The GPU exporter serves its error counters only from their first error (sparse rows of
    the metric table, docs/gpu_exporter.md): on a healthy fleet a plain `increase()` panel is
    "no data", and a counter born at 1 never shows in `increase()` (one value, no rise). The
    count of GPUs whose counter exists catches that first error and reads 0, not "no data",
    while nothing happened. (`increase(...) >= 0` keeps every series and satisfies the
    counter-inside-increase lint.)"""
    return holders_of(counter, "job, instance, gpu")


def holders_of(counter: str, by: str) -> str:
    """How many `by` groups (GPUs, ranks) serve the sparse `counter` at all, 0 when none do
    (see gpus_with_errors)."""
    per_holder = f"count by ({by}) (increase({counter}[$__rate_interval]) >= 0)"
    return f"count({per_holder}) or on() vector(0)"


def _targets(builder: PanelT, queries: tuple[Q, ...], instant: bool) -> PanelT:
    for ref, query in zip("ABCDEFGH", queries, strict=False):
        target = prometheus.Dataquery().expr(query.expr).ref_id(ref)
        if query.legend:
            target = target.legend_format(query.legend)
        if instant:
            target = target.instant()
        builder = builder.with_target(target)
    return builder


def timeseries_panel(title: str, description: str, unit: str, *queries: Q, width: int = 12,
                     height: int = 8, min_value: float | None = None) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).unit(unit)
             .datasource(DATASOURCE).span(width).height(height)
             .legend(gc.VizLegendOptions().show_legend(True)
                     .display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM))
             .tooltip(gc.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                      .sort(cm.SortOrder.NONE)))
    if min_value is not None:
        panel = panel.min(min_value)
    return _targets(panel, queries, instant=False)


def stat_panel(title: str, description: str, unit: str, *queries: Q, width: int = 6,
               height: int = 4) -> stat.Panel:
    panel = (stat.Panel().title(title).description(description).unit(unit)
             .datasource(DATASOURCE).span(width).height(height)
             .reduce_options(gc.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    return _targets(panel, queries, instant=True)


def table_panel(title: str, description: str, unit: str, *queries: Q, width: int = 24,
                height: int = 8) -> table.Panel:
    panel = (table.Panel().title(title).description(description).unit(unit)
             .datasource(DATASOURCE).span(width).height(height).show_header(True))
    return _targets(panel, queries, instant=True)


def datasource_variable() -> gd.DatasourceVariable:
    return gd.DatasourceVariable("datasource").label("Data source").type("prometheus")


def query_variable(name: str, label: str, query: str, all_value: str = ALL_REGEX,
                   description: str = "") -> gd.QueryVariable:
    """A multi-select label_values() variable that re-reads when the time range changes."""
    variable = (gd.QueryVariable(name).label(label).datasource(DATASOURCE).query(query)
                .multi(True).include_all(True).all_value(all_value)
                .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
                .sort(dm.VariableSort.ALPHABETICAL_ASC))
    return variable.description(description) if description else variable


# How many ranks a per-rank panel draws: a 1,024-rank job's every line is no chart. The panels
# keep the ranks that matter (highest loss or step time, lowest FLOP/s) with topk/bottomk.
RANKS_SHOWN = "ranks_shown"
RANKS_SHOWN_CHOICES = ("10", "20", "50", "100", "1000")
RANKS_SHOWN_DEFAULT = "20"


def ranks_shown_variable() -> gd.CustomVariable:
    """The `ranks_shown` choice: the k of the per-rank panels' topk/bottomk."""
    option = dm.VariableOption(selected=True, text=RANKS_SHOWN_DEFAULT, value=RANKS_SHOWN_DEFAULT)
    return (gd.CustomVariable(RANKS_SHOWN).label("Ranks shown")
            .description("Per-rank panels draw this many ranks: the highest loss, gradient "
                         "norm or step time, the lowest FLOP/s.")
            .values(",".join(RANKS_SHOWN_CHOICES)).current(option))


def top_ranks(expr: str, lowest: bool = False) -> str:
    """`expr` (one series per rank) cut to the `ranks_shown` ranks that matter most."""
    return f"{'bottomk' if lowest else 'topk'}(${RANKS_SHOWN}, {expr})"


# The training logs (ECS JSON through Filebeat and Logstash) in the Elasticsearch data source
# the grafana role provisions (uid trainwatch-elasticsearch); a variable, like Prometheus's.
LOGS_DATASOURCE = "elasticsearch_datasource"


def logs_datasource_variable() -> gd.DatasourceVariable:
    return (gd.DatasourceVariable(LOGS_DATASOURCE).label("Elasticsearch data source")
            .type("elasticsearch"))


def logs_panel(title: str, description: str, lucene: str, *, width: int = 24,
               height: int = 10) -> logs.Panel:
    """A log panel over the training logs: newest first, with each line's ECS fields."""
    query = (elasticsearch.Dataquery().ref_id("A").query(lucene).time_field("@timestamp")
             .metrics([elasticsearch.Logs().id("1")]))
    return (logs.Panel().title(title).description(description)
            .datasource(dm.DataSourceRef(type_val="elasticsearch", uid=f"${{{LOGS_DATASOURCE}}}"))
            .span(width).height(height).show_time(True).wrap_log_message(True)
            .enable_log_details(True).sort_order(cm.LogsSortOrder.DESCENDING)
            .with_target(query))


def cluster_variable(metric: str) -> gd.QueryVariable:
    return query_variable(
        "cluster", "Cluster", f"label_values({metric}, cluster)", all_value=ANY_REGEX,
        description="The `cluster` external label, when several Prometheus servers feed Grafana; "
                    "empty on a single cluster.")


def with_scope_variables(dashboard: gd.Dashboard, metric: str) -> gd.Dashboard:
    """The cluster -> job -> instance chain every dashboard starts with, read from `metric`
    (a series the dashboard's own exporter always emits, so the lists are never empty)."""
    return (dashboard
            .with_variable(cluster_variable(metric))
            .with_variable(query_variable(
                "job", "Job", f'label_values({metric}{{cluster=~"$cluster"}}, job)'))
            .with_variable(query_variable(
                "instance", "Instance",
                f'label_values({metric}{{cluster=~"$cluster",job=~"$job"}}, instance)')))


TAG = "trainwatch"


def sibling_links() -> gd.DashboardLink:
    """A drop-down of every Trainwatch dashboard (Grafana lists those with the tag), keeping
    the time range and the variables: from a GPU to its node, its job, the alerts."""
    return (gd.DashboardLink("Trainwatch").type(dm.DashboardLinkType.DASHBOARDS).tags([TAG])
            .as_dropdown(True).keep_time(True).include_vars(True).target_blank(False)
            .icon("external link").tooltip("").url(""))


def new_dashboard(uid: str, title: str, description: str, tags: list[str]) -> gd.Dashboard:
    return (gd.Dashboard(title).uid(uid).description(description)
            .tags([TAG, *tags]).refresh("30s").time("now-1h", "now")
            .timezone("browser").tooltip(dm.DashboardCursorSync.CROSSHAIR)
            .link(sibling_links())
            .with_variable(datasource_variable()))


def scoped_dashboard(uid: str, title: str, description: str, tags: list[str], metric: str,
                     *variables: gd.QueryVariable) -> gd.Dashboard:
    """A new dashboard with the scope variables read from `metric`, then `variables` in
    order: the header every Trainwatch dashboard starts with, built in one place."""
    dashboard = with_scope_variables(new_dashboard(uid, title, description, tags), metric)
    for variable in variables:
        dashboard = dashboard.with_variable(variable)
    return dashboard


def instance_label_variable(name: str, label: str, metric: str) -> gd.QueryVariable:
    """A variable over the values of label `name` of `metric` on the selected jobs and
    instances (a GPU index, a training job)."""
    return query_variable(
        name, label, f'label_values({metric}{{job=~"$job",instance=~"$instance"}}, {name})')


def add_panels(dashboard: gd.Dashboard, *panels: cogbuilder.Builder[dm.Panel]) -> gd.Dashboard:
    """Add panels in order with ids 1..n, so panel ids (and links to them) stay stable."""
    for number, panel in enumerate(panels, start=1):
        dashboard = dashboard.with_panel(panel.id(number))
    return dashboard
