"""Goodput: where a job's time went (docs/goodput.md), with what remediation did to it."""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.models import common as cm

from alert_rules import goodput as rules
from dashboards.panels import (
    CLUSTER,
    DATASOURCE,
    SCOPE,
    Q,
    add_panels,
    instance_label_variable,
    scoped_dashboard,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.contract.goodput import PRODUCTIVE

UID = "trainwatch-goodput"
# What one fault costs when a person answers it instead of a playbook: page, diagnosis and the
# fix by hand. An assumption (30 minutes), not a measurement: set it to your on-call's own
# median time from page to mitigation (docs/goodput.md).
HUMAN_RESPONSE_SECONDS = 1800
J = 'training_job=~"$training_job"'
T = f"{SCOPE},{J}"
JOB = "{{training_job}}"


def _mean_per_playbook(histogram: str) -> str:
    """A remediation histogram's mean per playbook over the rate interval (the remediation
    service's series carry no job: they are its own scrape job's)."""
    return (f"sum by (playbook) (increase({histogram}_sum{{{CLUSTER}}}[$__rate_interval]))\n"
            f"/ sum by (playbook) (increase({histogram}_count{{{CLUSTER}}}"
            f"[$__rate_interval]))")


def _share(rate: str) -> str:
    """A recorded per-job rate as a share of the sum of the job's kind rates: the kinds stack
    to exactly 1 (the wall counter's own rate is extrapolated differently from each kind's,
    so dividing by it does not add up). Absent, never NaN, while nothing is counted."""
    return (f"{rate}\n/ on (training_job) group_left ()\n"
            f"(sum by (training_job) ({rules.KIND_RATE}{{{J}}}) > 0)")


def _over_range(histogram: str, part: str) -> str:
    return f"sum by (playbook) (increase({histogram}_{part}{{{CLUSTER}}}[$__range]))"


def _cost_and_saving() -> list[Q]:
    """Per playbook over the dashboard's range: the faults it healed, the seconds each cost
    with healing (to detection, to recovery), and what each saved against a person's
    response."""
    healed = _over_range(c.REMEDIATION_TIME_TO_RECOVER, "count")
    detect = (f"{_over_range(c.REMEDIATION_TIME_TO_DETECT, 'sum')}\n"
              f"/ {_over_range(c.REMEDIATION_TIME_TO_DETECT, 'count')}")
    recover = f"{_over_range(c.REMEDIATION_TIME_TO_RECOVER, 'sum')}\n/ {healed}"
    return [Q(healed, "faults healed"), Q(detect, "seconds to detect"),
            Q(recover, "seconds to recover"),
            Q(f"{HUMAN_RESPONSE_SECONDS} - ({recover})", "seconds saved per fault")]


def _annotations(dashboard: gd.Dashboard) -> gd.Dashboard:
    """What remediation did to the job (the commands its ranks applied: LR cuts, rollbacks,
    checkpoints) and the alerts that fired for it, as marks on every time panel."""
    # a command type's counter is born at 1 (its first command): increase() never sees that
    # one, so a series new in the interval counts as an event too
    series = f"{c.TRAINING_COMMANDS_APPLIED}{{{T}}}"
    applied = (f"sum by (training_job, command) (\n"
               f"  increase({series}[$__rate_interval]) > 0\n"
               f"  or ({series} unless {series} offset $__rate_interval))")
    firing = f'ALERTS{{alertstate="firing",{J}}}'
    return (dashboard
            .annotation(gd.AnnotationQuery().name("Remediation: commands applied")
                        .datasource(DATASOURCE).enable(True).icon_color("orange")
                        .expr(applied))
            .annotation(gd.AnnotationQuery().name("Alerts firing").datasource(DATASOURCE)
                        .enable(True).icon_color("red").expr(firing)))


def build() -> gd.Dashboard:
    dashboard = scoped_dashboard(
        UID, "Trainwatch / Goodput",
        "Where a job's time went: effective training time ratio (ETTR) and badput by cause, "
        "across restarts, with remediation's actions as annotations.", ["training"],
        c.TRAINING_NODE_WALL,
        instance_label_variable("training_job", "Training job", c.TRAINING_NODE_WALL))
    stacked = gc.StackingConfig().mode(cm.StackingMode.NORMAL)
    return add_panels(
        _annotations(dashboard),
        stat_panel("ETTR (life)", "Goodput over wall since the job's first start: productive "
                   "seconds less those rollbacks and restarts threw away, over all seconds.",
                   "percentunit", Q(f"{rules.ETTR_LIFE}{{{J}}}", JOB)),
        stat_panel("ETTR (1 h)", "The same over the last hour.", "percentunit",
                   Q(f"{rules.ETTR_1H}{{{J}}}", JOB)),
        stat_panel("ETTR (24 h)", "The same over the last day.", "percentunit",
                   Q(f"{rules.ETTR_24H}{{{J}}}", JOB)),
        stat_panel("Ranks counted", "The job's world size: the ranks whose every second is "
                   "counted (through stalls and the downtime between incarnations too: their "
                   "seconds are booked when the stall or the downtime ends).", "none",
                   Q(f"max by (training_job) ({c.TRAINING_WORLD_SIZE}{{{T}}})", JOB)),
        timeseries_panel("ETTR over time", "Goodput over wall over the rate window (thin) and "
                         "over the last hour; TrainingGoodputLow fires when the hour stays "
                         "under the target. The thin line is absent while no second is "
                         "counted, and 0 in a window where a restart's or rollback's "
                         "discarded seconds (counted when the steps ran) outweigh its "
                         "productive ones.", "percentunit",
                         Q(f"clamp({rules.GOODPUT_RATE}{{{J}}}\n"
                           f"/ ({rules.WALL_RATE}{{{J}}} > 0), 0, 1)", f"{JOB} now"),
                         Q(f"{rules.ETTR_1H}{{{J}}}", f"{JOB} 1 h"), min_value=0),
        timeseries_panel("Time by kind", "Share of the job's time in each kind: productive "
                         "and every badput cause (startup, data wait, checkpoint save and "
                         "restore, stall, downtime between incarnations, unattributed); "
                         "stacked, they add up to 1.", "percentunit",
                         Q(_share(f"{rules.KIND_RATE}{{{J}}}"),
                           "{{training_job}} {{kind}}"), min_value=0).stacking(stacked),
        timeseries_panel("Badput by cause", "The badput causes alone, stacked (the share of "
                         "wall each one took).", "percentunit",
                         Q(_share(f'{rules.KIND_RATE}{{{J},kind!="{PRODUCTIVE}"}}'),
                           "{{training_job}} {{kind}}"), min_value=0).stacking(stacked),
        timeseries_panel("Discarded by cause", "Share of wall spent on steps later thrown "
                         "away, by cause: a rollback (back to a healthy checkpoint) or a "
                         "restart (progress since the last checkpoint). Part of productive.",
                         "percentunit",
                         Q(_share(f"{rules.DISCARDED_RATE}{{{J}}}"),
                           "{{training_job}} {{cause}}"), min_value=0).stacking(stacked),
        timeseries_panel("Seconds by kind per node", "Each node's rank-seconds per second in "
                         "each kind (the exporters' own counters): a node whose ranks stall or "
                         "wait for data more than the others stands out.", "s",
                         Q(f"sum by (training_job, node, kind) (rate({c.TRAINING_NODE_TIME}"
                           f"{{{T}}}[$__rate_interval]))",
                           "{{training_job}} {{node}} {{kind}}"), width=24),
        timeseries_panel("Data wait and checkpoint save per rank", "The causes that point "
                         "at one rank: seconds per second each rank waited for its loader or "
                         "was blocked saving a checkpoint (a slow loader or slow storage on "
                         "one node stands out).", "percentunit",
                         Q(f"rate({c.TRAINING_RANK_BADPUT}{{{T}}}[$__rate_interval])",
                           "{{training_job}} rank {{rank}} {{kind}}"), width=24, min_value=0),
        timeseries_panel("Time to detect by playbook", "What self-healing saved, part 1: "
                         "seconds from a fault's first evidence (its alert's condition first "
                         "seen) to the alert firing, mean per playbook of the intents that "
                         "acted in the interval (remediation/recovery.py).", "s",
                         Q(_mean_per_playbook(c.REMEDIATION_TIME_TO_DETECT), "{{playbook}}"),
                         min_value=0),
        timeseries_panel("Time to recover by playbook", "Part 2: seconds from the first "
                         "evidence to the playbook's last step done, the job going again with "
                         "the fix (an LR cut: every rank applied it, its next step runs at the "
                         "new LR).", "s",
                         Q(_mean_per_playbook(c.REMEDIATION_TIME_TO_RECOVER), "{{playbook}}"),
                         min_value=0),
        table_panel("Cost of each fault, saved by each healing", "Per playbook over the "
                    "dashboard's time range: the faults it healed, the mean seconds each "
                    "cost with healing (first evidence to the alert firing, and to the job "
                    f"going again), and the seconds saved per fault against a person's "
                    f"response ({HUMAN_RESPONSE_SECONDS // 60} minutes from page to fix, "
                    "an assumption: docs/goodput.md). The work each fault threw away is in "
                    "\"Discarded by cause\"; each second is rank-seconds there.", "s",
                    *_cost_and_saving()),
    )
