"""Stack health: the monitoring stack and Trainwatch's own exporters watching themselves."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as gd

from alert_rules import recording
from dashboards.panels import (
    CLUSTER,
    SCOPE,
    Q,
    add_panels,
    scoped_dashboard,
    table_panel,
    timeseries_panel,
)
from trainwatch.exporters.contract import catalog as c

UID = "trainwatch-stack-health"
S = SCOPE
C = CLUSTER


def build() -> gd.Dashboard:
    dashboard = scoped_dashboard(
        UID, "Trainwatch / Stack health",
        "Scrape targets, Prometheus, Alertmanager, node resources and Trainwatch's "
        "exporters.", ["stack"], "up")
    return add_panels(
        dashboard,
        table_panel("Scrape targets", "Every target with its up state (1 = scraped).", "none",
                    Q(f"up{{{S}}}")),
        timeseries_panel("Targets up by job", "Targets answering scrapes, per scrape job.",
                         "none", Q(f"sum by (job) (up{{{S}}})", "{{job}}"), min_value=0),
        timeseries_panel("Scrape duration", "How long each target takes to scrape; close to the "
                         "scrape timeout means slow collection.", "s",
                         Q(f"scrape_duration_seconds{{{S}}}", "{{job}} {{instance}}")),
        timeseries_panel("Rule group evaluation time", "Time each rule group took on its last "
                         "evaluation; must stay well below the evaluation interval.", "s",
                         Q(f"prometheus_rule_group_last_duration_seconds{{{C}}}",
                           "{{rule_group}}")),
        timeseries_panel("Rule evaluation failures", "Failed rule evaluations per second, per "
                         "group.", "ops",
                         Q(f"sum by (rule_group) (rate(prometheus_rule_evaluation_failures_total"
                           f"{{{C}}}[$__rate_interval]))", "{{rule_group}}"), min_value=0),
        timeseries_panel("Head series and ingestion", "Active series in the TSDB head and "
                         "samples appended per second.", "short",
                         Q(f"prometheus_tsdb_head_series{{{C}}}", "series"),
                         Q(f"rate(prometheus_tsdb_head_samples_appended_total{{{C}}}"
                           f"[$__rate_interval])", "samples/s")),
        timeseries_panel("Alerts sent to Alertmanager", "Alert notifications Prometheus sent and "
                         "dropped.", "ops",
                         Q(f"sum(rate(prometheus_notifications_sent_total{{{C}}}"
                           f"[$__rate_interval]))", "sent"),
                         Q(f"sum(rate(prometheus_notifications_dropped_total{{{C}}}"
                           f"[$__rate_interval]))", "dropped"), min_value=0),
        timeseries_panel("Alertmanager alerts", "Alerts Alertmanager holds, by state.", "none",
                         Q(f"sum by (state) (alertmanager_alerts{{{C}}})", "{{state}}"),
                         min_value=0),
        timeseries_panel("Node CPU busy", "Fraction of CPU time not idle, per node.",
                         "percentunit",
                         Q(f'1 - avg by (instance) (rate(node_cpu_seconds_total{{{C},mode="idle"}}'
                           f"[$__rate_interval]))", "{{instance}}"), min_value=0),
        timeseries_panel("Node memory used", "1 - MemAvailable / MemTotal per node "
                         "(NodeMemoryHigh).", "percentunit",
                         Q(f"{recording.NODE_MEMORY_UTILISATION}{{{C}}}", "{{instance}}"),
                         min_value=0),
        timeseries_panel("Filesystem space free", "Free fraction of each real filesystem "
                         "(NodeDiskFilling below 10%).", "percentunit",
                         Q(f'{c.NODE_FS_AVAIL}{{{C},fstype!~"tmpfs|ramfs|overlay|'
                           f'squashfs|nsfs|fuse.lxcfs|autofs|devtmpfs"}}\n/\n'
                           f'{c.NODE_FS_SIZE}{{{C},fstype!~"tmpfs|ramfs|overlay|'
                           f'squashfs|nsfs|fuse.lxcfs|autofs|devtmpfs"}}',
                           "{{instance}} {{mountpoint}}"), min_value=0),
        timeseries_panel("Training exporter intake", "Datagrams the training exporters received "
                         "from ranks, and malformed ones they ignored.", "ops",
                         Q(f"sum by (instance) (rate({c.TRAINING_EXPORTER_DATAGRAMS}"
                           f"{{{C}}}[$__rate_interval]))", "{{instance}} received"),
                         Q(f"sum by (instance) (rate("
                           f"{c.TRAINING_EXPORTER_MALFORMED}{{{C}}}"
                           f"[$__rate_interval]))", "{{instance}} malformed"), min_value=0),
        timeseries_panel("GPU exporter collections", "NVML collection cycles per second by "
                         "result (success, overrun, nvml_down).", "ops",
                         Q(f"sum by (instance, result) (rate("
                           f"{c.GPU_EXPORTER_COLLECTIONS}{{{C}}}[$__rate_interval]))",
                           "{{instance}} {{result}}"), min_value=0),
    )
