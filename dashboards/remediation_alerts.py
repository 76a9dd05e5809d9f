"""Remediation and alerts: what is firing, and what Trainwatch did about it."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as gd

from dashboards.panels import (
    CLUSTER,
    SCOPE,
    Q,
    add_panels,
    scoped_dashboard,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from trainwatch.exporters.contract import catalog as c

UID = "trainwatch-remediation-alerts"
R = SCOPE
C = CLUSTER


def build() -> gd.Dashboard:
    dashboard = scoped_dashboard(
        UID, "Trainwatch / Remediation and alerts",
        "Firing alerts and the remediation service's decisions, actions and "
        "safety switches.", ["remediation", "alerts"], c.REMEDIATION_CIRCUIT_BREAKER_OPEN)
    return add_panels(
        dashboard,
        stat_panel("Firing alerts", "Alerts firing now, Watchdog included (so never 0 while "
                   "the pipeline works).", "none",
                   Q(f'count(ALERTS{{{C},alertstate="firing"}})')),
        stat_panel("Circuit breaker", "1 = open: the remediation service stopped acting "
                   "automatically (RemediationCircuitBreakerOpen).", "bool_on_off",
                   Q(f"max({c.REMEDIATION_CIRCUIT_BREAKER_OPEN}{{{R}}})")),
        stat_panel("Actions in breaker window", "Actions granted inside the circuit breaker's "
                   "window; the breaker opens at its configured maximum.", "none",
                   Q(f"max({c.REMEDIATION_ACTIONS_IN_BREAKER_WINDOW}{{{R}}})")),
        stat_panel("Oldest unfinished intent", "Age of the oldest remediation intent not yet "
                   "finished (waiting for approval or still running).", "s",
                   Q(f"max({c.REMEDIATION_OLDEST_PENDING_AGE}{{{R}}})")),
        table_panel("Firing alerts", "Every firing alert with its labels.", "none",
                    Q(f'ALERTS{{{C},alertstate="firing"}}')),
        table_panel("Lemon nodes", "Nodes quarantined inside the quarantine window: how often "
                    "(node_faults), the time between their last two faults, and whether one is "
                    "kept out (quarantined lemon_faults times: trainwatch-resume-node refuses "
                    "it until its faults leave the window). Worst first.", "none",
                    Q(f"sort_desc(max by (node) ({c.REMEDIATION_NODE_FAULTS}{{{R}}}))",
                      "faults"),
                    Q(f"min by (node) ({c.REMEDIATION_NODE_FAULT_INTERVAL}{{{R}}})",
                      "seconds between the last two"),
                    Q(f"max by (node) ({c.REMEDIATION_NODE_KEPT_OUT}{{{R}}})", "kept out")),
        timeseries_panel("Firing alerts by severity", "Firing alerts over time, by severity.",
                         "none", Q(f'sum by (severity) (ALERTS{{{C},alertstate="firing"}})',
                                   "{{severity}}"), min_value=0),
        timeseries_panel("Pending alerts", "Alerts whose condition holds but whose `for` has not "
                         "elapsed yet.", "none",
                         Q(f'sum by (alertname) (ALERTS{{{C},alertstate="pending"}})',
                           "{{alertname}}"), min_value=0),
        timeseries_panel("Webhook alerts by outcome", "Alerts the remediation webhook received, "
                         "by what intake did with them (accepted, deduplicated, refused, "
                         "resolved, unmatched).", "none",
                         Q(f"sum by (outcome) (increase({c.REMEDIATION_WEBHOOK_ALERTS}{{{R}}}"
                           f"[$__rate_interval]))", "{{outcome}}"), min_value=0),
        timeseries_panel("Webhook latency p99", "Time to persist and answer one Alertmanager "
                         "webhook call.", "s",
                         Q(f"histogram_quantile(0.99, sum by (le) (rate("
                           f"{c.REMEDIATION_WEBHOOK_DURATION}_bucket{{{R}}}[$__rate_interval])))",
                           "p99")),
        timeseries_panel("Decisions", "Remediation decisions by kind (acted, refused, "
                         "cooled_down, ...).", "none",
                         Q(f"sum by (decision) (increase({c.REMEDIATION_DECISIONS}{{{R}}}"
                           f"[$__rate_interval]))", "{{decision}}"), min_value=0),
        timeseries_panel("Actions by result", "Playbook actions that finished, by playbook, "
                         "action and result.", "none",
                         Q(f"sum by (playbook, action, result) "
                           f"(increase({c.REMEDIATION_ACTIONS}{{{R}}}[$__rate_interval]))",
                           "{{playbook}} {{action}} {{result}}"),
                         min_value=0),
        timeseries_panel("Intents by state", "Remediation intents in the store by state.",
                         "none", Q(f"sum by (state) ({c.REMEDIATION_INTENTS}{{{R}}})", "{{state}}"),
                         min_value=0),
        timeseries_panel("Alertmanager notifications", "Notifications Alertmanager sent and "
                         "failed, per integration (webhook = remediation).", "ops",
                         Q(f"sum by (integration) (rate({c.AM_NOTIFICATIONS}{{{C}}}"
                           f"[$__rate_interval]))", "{{integration}} sent"),
                         Q(f"sum by (integration) (rate("
                           f"{c.AM_NOTIFICATIONS_FAILED}{{{C}}}[$__rate_interval]))",
                           "{{integration}} failed"), min_value=0),
    )
