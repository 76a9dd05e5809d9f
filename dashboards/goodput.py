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
    timeseries_panel,
)
from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.contract.goodput import PRODUCTIVE

UID = "trainwatch-goodput"
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
    """A recorded per-job rate as a share of the job's wall rate (stacks to 1 over kinds)."""
    return f"{rate} / on (training_job) group_left {rules.WALL_RATE}{{{J}}}"


def _annotations(dashboard: gd.Dashboard) -> gd.Dashboard:
    """What remediation did to the job (the commands its ranks applied: LR cuts, rollbacks,
    checkpoints) and the alerts that fired for it, as marks on every time panel."""
    applied = (f"sum by (training_job, command) (increase({c.TRAINING_COMMANDS_APPLIED}"
               f"{{{T}}}[$__rate_interval])) > 0")
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
        stat_panel("Ranks counted", "Wall rank-seconds per second over the rate window: "
                   "the ranks whose time is being counted (every second of a rank slot "
                   "counts, downtime between incarnations included).", "none",
                   Q(f"{rules.WALL_RATE}{{{J}}}", JOB)),
        timeseries_panel("ETTR over time", "Goodput over wall over the rate window (thin) and "
                         "over the last hour; TrainingGoodputLow fires when the hour stays "
                         "under the target.", "percentunit",
                         Q(f"{rules.GOODPUT_RATE}{{{J}}} / {rules.WALL_RATE}{{{J}}}",
                           f"{JOB} now"),
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
    )
