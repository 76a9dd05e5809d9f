"""Goodput rules: the job's ETTR over 1 h, 24 h and its life, and TrainingGoodputLow.

The training exporters serve one series per job, node and kind (docs/goodput.md), so the
rules read nodes x 11 series, never ranks. The per-job rates are recorded once per
`slow_interval` (their window is the rate window); the 1 h and 24 h ratios average those
recordings (a per-job series each) instead of reading a day of every node's counters, and the
life ratio reads the counters as they are.
"""

from __future__ import annotations

from alert_rules.config import Profile, seconds
from alert_rules.model import Alert, Group, Record, alert_groups
from alert_rules.promql import sel
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract.goodput import PRODUCTIVE

WALL_RATE = "training_job:training_wall_seconds:rate"
GOODPUT_RATE = "training_job:training_goodput_seconds:rate"
KIND_RATE = "training_job_kind:training_time_seconds:rate"
DISCARDED_RATE = "training_job_cause:training_discarded_seconds:rate"
ETTR_1H = "training_job:training_ettr:ratio_over_hour"
ETTR_24H = "training_job:training_ettr:ratio_over_day"
ETTR_LIFE = "training_job:training_ettr:ratio_over_life"
ALL = (WALL_RATE, GOODPUT_RATE, KIND_RATE, DISCARDED_RATE, ETTR_1H, ETTR_24H, ETTR_LIFE)


def _series(p: Profile) -> tuple[str, str, str]:
    training = p.selector("training")
    return (sel(catalog.TRAINING_NODE_WALL, training),
            sel(catalog.TRAINING_NODE_TIME, f'{training},kind="{PRODUCTIVE}"'),
            sel(catalog.TRAINING_NODE_DISCARDED, training))


def ettr_over(window: str) -> str:
    """The job's ETTR over a window: its recorded goodput rate over its recorded wall rate,
    both averaged over the window (the window's goodput seconds over its wall seconds)."""
    return (f"avg_over_time({GOODPUT_RATE}[{window}])\n"
            f"/ avg_over_time({WALL_RATE}[{window}])")


def records(p: Profile) -> list[Record]:
    w = p.rate_window
    wall, productive, discarded = _series(p)
    kinds = sel(catalog.TRAINING_NODE_TIME, p.selector("training"))
    return [
        Record(WALL_RATE, f"sum by (training_job) (rate({wall}[{w}]))"),
        # productive minus discarded (the exporter serves both discard causes, 0 or not)
        Record(GOODPUT_RATE,
               f"sum by (training_job) (rate({productive}[{w}]))\n"
               f"- sum by (training_job) (rate({discarded}[{w}]))"),
        Record(KIND_RATE, f"sum by (training_job, kind) (rate({kinds}[{w}]))"),
        Record(DISCARDED_RATE, f"sum by (training_job, cause) (rate({discarded}[{w}]))"),
        # `> -1` drops a 0/0 (a job that has counted nothing yet) instead of recording NaN
        Record(ETTR_1H, f"{ettr_over('1h')} > -1"),
        Record(ETTR_24H, f"{ettr_over('24h')} > -1"),
        # since the job's first start: the counters' whole life
        Record(ETTR_LIFE,
               f"(sum by (training_job) ({productive})\n"
               f"- sum by (training_job) ({discarded}))\n"
               f"/ sum by (training_job) ({wall}) > -1"),
    ]


def _goodput_low(p: Profile) -> Alert:
    cfg = p.alert("TrainingGoodputLow")
    window, target = cfg["window"], cfg["target_ratio"]
    settled = f"{seconds(window) + seconds(p.rate_window):g}s"
    return Alert(
        "TrainingGoodputLow",
        # only jobs whose steps were already counted a window and a rate window ago (their
        # wall grew then; a job's wall first grows at its first step, all its startup at
        # once): a job's first window is mostly that startup, which is no fault
        f"{ettr_over(window)} < {target}\n"
        f"and on (training_job) ({WALL_RATE} offset {settled} > 0)",
        "warning", "training",
        "Job {{ $labels.training_job }} kept only {{ $value | humanizePercentage }} of its "
        f"time over {window}",
        "Job {{ $labels.training_job }} turned only {{ $value | humanizePercentage }} of its "
        f"time over the last {window} into progress it kept (target {target:g}). The Goodput "
        "dashboard shows where the rest went, by cause (startup, data wait, checkpoints, "
        "stalls, downtime between restarts, steps discarded by rollbacks and restarts).",
        for_=str(cfg["for"]))


def groups(p: Profile) -> list[Group]:
    return [Group("trainwatch-goodput.rules", records(p), p.slow_interval),
            *alert_groups("goodput", [_goodput_low(p)], p.alert_interval,
                          p.alert_group_suffix)]
