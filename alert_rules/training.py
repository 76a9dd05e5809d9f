"""Training alerts: the job's own signals (loss, gradients, throughput, progress, ranks, logs).

Every training alert keeps `training_job`, so Alertmanager groups per job and the
remediation service knows which job to act on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from alert_rules import recording
from alert_rules.config import Profile
from alert_rules.model import Alert, Group, Record
from alert_rules.promql import new_events, sel
from exporters import catalog

JOB_RANK = "job {{ $labels.training_job }} rank {{ $labels.rank }}"


def aggregated(p: Profile) -> bool:
    return bool(p.values.get("aggregate_per_job_and_node", True))


def _spike_expr(p: Profile, metric: str, cfg: dict[str, Any],
                rule: Callable[[str, str], str]) -> str:
    """`metric` far above its own mean over a window that ended `baseline_offset` ago.

    The offset keeps the spike out of its own baseline. A series without enough baseline
    samples (job start, restart) yields nothing, so a fresh job cannot fire. The baseline
    stays per rank, computed in place: recording it per rank was measured (rules_eval) to
    cost as much as it saves, because reading a per-rank series costs about as much as
    scanning its window.
    """
    series = sel(metric, p.selector("training"))
    past = f"[{cfg['baseline_window']}] offset {cfg['baseline_offset']}"
    baseline = f"avg_over_time({series}{past})"
    enough = f"count_over_time({series}{past}) >= {cfg['baseline_min_samples']}"
    return f"{rule(series, baseline)}\nand\n{enough}"


def _loss_spike(p: Profile) -> Alert:
    cfg = p.alert("TrainingLossSpike")
    # relative to |baseline| so negative losses work, plus an absolute floor for tiny ones

    def rule(series: str, baseline: str) -> str:
        return (f"({series} - {baseline}) > {cfg['factor'] - 1} * abs({baseline})\nand\n"
                f"({series} - {baseline}) > {cfg['min_delta']}")

    return Alert(
        "TrainingLossSpike", _spike_expr(p, catalog.TRAINING_LOSS, cfg, rule), "warning",
        "training",
        f"Loss spike in {JOB_RANK}",
        f"The loss of {JOB_RANK} on {{{{ $labels.node }}}} is {{{{ $value | printf \"%.3g\" }}}} "
        f"above its mean over the {cfg['baseline_window']} before the last "
        f"{cfg['baseline_offset']} (more than {cfg['factor']:g}x). Trainwatch cuts the learning "
        "rate automatically (lr_reduction playbook); if the loss does not come back within a "
        "few hundred steps, roll back to the last healthy checkpoint.",
        for_=cfg["for"],
    )


def _grad_norm(p: Profile) -> Alert:
    cfg = p.alert("TrainingGradNormExplosion")

    def rule(series: str, baseline: str) -> str:
        return f"{series} > {cfg['factor']} * {baseline}\nand\n{series} > {cfg['min_value']}"

    return Alert(
        "TrainingGradNormExplosion", _spike_expr(p, catalog.TRAINING_GRAD_NORM, cfg, rule),
        "warning", "training",
        f"Gradient norm explosion in {JOB_RANK}",
        f"The gradient norm of {JOB_RANK} is {{{{ $value | printf \"%.3g\" }}}}, more than "
        f"{cfg['factor']:g}x its recent mean. A loss spike or NaN usually follows. Trainwatch "
        "cuts the learning rate automatically (lr_reduction playbook); check gradient clipping "
        "and the data batch at this step.",
        for_=cfg["for"],
    )


def _nonfinite(p: Profile) -> Alert:
    cfg = p.alert("TrainingNonFiniteLoss")
    training = p.selector("training")
    loss = sel(catalog.TRAINING_LOSS, training)
    counter = sel(catalog.TRAINING_NONFINITE_LOSS, training)
    expr = (f"{new_events(counter, cfg['window'])}\n"
            f"or\n({loss} != {loss})\nor\n(abs({loss}) == Inf)")
    return Alert(
        "TrainingNonFiniteLoss", expr, "critical", "training",
        f"Non-finite (NaN/Inf) loss in {JOB_RANK}",
        f"Rank {{{{ $labels.rank }}}} of job {{{{ $labels.training_job }}}} reported a NaN or "
        f"infinite loss within the last {cfg['window']}. The next "
        "optimizer step writes NaN into the weights and every later step is wasted. Trainwatch "
        "rolls the job back to the newest healthy checkpoint automatically "
        "(checkpoint_rollback playbook); the alert stays up for "
        f"{cfg['keep_firing_for']} after the last bad loss so you can follow the rollback.",
        for_=cfg["for"], keep_firing_for=cfg["keep_firing_for"],
    )


def _throughput(p: Profile) -> Alert:
    cfg = p.alert("TrainingThroughputDrop")
    baseline = (f"avg_over_time({recording.SAMPLES_RATE}"
                f"[{cfg['baseline_window']}] offset {cfg['baseline_offset']})")
    # only while the job still steps: a stopped job is TrainingStalled's (or simply finished)
    stepping = (f"max by (training_job) (changes("
                f"{sel(catalog.TRAINING_STEP, p.selector('training'))}[{p.rate_window}])) > 0")
    expr = (f"{recording.SAMPLES_RATE} < {cfg['factor']} * {baseline}\n"
            f"and\n{baseline} > {cfg['min_baseline']}\n"
            f"and on (training_job)\n{stepping}")
    return Alert(
        "TrainingThroughputDrop", expr, "warning", "training",
        "Throughput of job {{ $labels.training_job }} dropped",
        "Job {{ $labels.training_job }} processes {{ $value | printf \"%.3g\" }} samples/s, "
        f"less than {cfg['factor'] * 100:g}% of its own mean over the {cfg['baseline_window']} "
        f"before the last {cfg['baseline_offset']}. Look for a straggler rank, GPU throttling, "
        "a slow data loader or a saturated network on the Training job dashboard.",
        for_=cfg["for"],
    )


# Recording rules of stall detection (one place; the alerts and dashboards read them).
STEP_TIME_MEDIAN = "training_job:training_step_duration_seconds:median"
STALL_THRESHOLD = "training_job:training_progress:stall_threshold_seconds"
PROGRESS_AGE = "training_job:training_progress:age_seconds"
HEARTBEAT_AGE_JOB = "training_job:training_heartbeat:age_seconds"
HEARTBEAT_AGE_RANK = "training_job_rank:training_heartbeat:age_seconds"
STALL_SUSPECT = "training_job_rank:training_progress:stall_suspect"
# per-job aggregates the per-rank suspect rule compares against (aggregate_per_job_and_node)
COLLECTIVE_SEQ_MAX = "training_job:training_collective_sequence:max"
STEP_MIN = "training_job:training_step:min"
JOB_STALLED = "training_job:training_progress:stalled"
# per job and node: what TrainingJobVanished remembers for `remember_for`
HEARTBEAT_MAX_INSTANCE = "training_job_instance:training_heartbeat_timestamp_seconds:max"


def _stall_records(p: Profile) -> list[Record]:
    """A job is stalled when no rank has finished a step for max(N x its own recent median
    step time, a floor) while its ranks are still alive (heartbeating); the suspects are the
    ranks that stopped first: those that did not enter the collective their peers are waiting
    in, or whose heartbeat stopped; failing both, those at the lowest step."""
    cfg = p.alert("TrainingStalled")
    training = p.selector("training")
    last = sel(catalog.TRAINING_LAST_STEP_TIMESTAMP, training)
    beat = sel(catalog.TRAINING_HEARTBEAT_TIMESTAMP, training)
    seq = sel(catalog.TRAINING_COLLECTIVE_SEQ, training)
    step = sel(catalog.TRAINING_STEP, training)
    bucket = sel(catalog.TRAINING_STEP_DURATION + "_bucket", training)
    floor = cfg["floor_seconds"]
    stalled = (f"{PROGRESS_AGE} > on (training_job) {STALL_THRESHOLD}\n"
               f"and on (training_job) {HEARTBEAT_AGE_JOB} < {cfg['heartbeat_stale_seconds']}")
    seq_max, step_min = f"max by (training_job) ({seq})", f"min by (training_job) ({step})"
    per_job: list[Record] = []
    if aggregated(p):
        # each per-job value computed once per round; the per-rank rule reads the results
        per_job = [Record(COLLECTIVE_SEQ_MAX, seq_max), Record(STEP_MIN, step_min),
                   Record(JOB_STALLED, stalled)]
        seq_max, step_min, stalled = COLLECTIVE_SEQ_MAX, STEP_MIN, JOB_STALLED
    behind = f"{seq} < on (training_job) group_left () {seq_max}"
    silent = f"{HEARTBEAT_AGE_RANK} > {cfg['heartbeat_stale_seconds']}"
    lowest = f"{step} == on (training_job) group_left () {step_min}"
    first = f"(({behind}) or ({silent}))"
    return [
        # NaN (no step in the window) is dropped by `> 0`, so the threshold falls to the floor
        Record(STEP_TIME_MEDIAN,
               f"histogram_quantile(0.5, sum by (training_job, le) "
               f"(rate({bucket}[{cfg['step_time_window']}]))) > 0"),
        Record(STALL_THRESHOLD,
               f"clamp_min({cfg['step_time_factor']} * {STEP_TIME_MEDIAN}, {floor})\n"
               f"or on (training_job)\n0 * max by (training_job) ({last}) + {floor}"),
        Record(PROGRESS_AGE, f"time() - max by (training_job) ({last})"),
        Record(HEARTBEAT_AGE_JOB, f"time() - max by (training_job) ({beat})"),
        Record(HEARTBEAT_AGE_RANK, f"time() - {beat}"),
        *per_job,
        # `and`/`unless` bind tighter than `or`: the lowest-step ranks only when no rank is
        # behind in collectives or silent
        Record(STALL_SUSPECT,
               f"(\n  {first} * 0 + 1\n  or\n  ({lowest}) * 0 + 1\n"
               f"  unless on (training_job) {first}\n)\nand on (training_job)\n"
               + (stalled if aggregated(p) else f"({stalled})")),
    ]


def _stalled(p: Profile) -> Alert:
    cfg = p.alert("TrainingStalled")
    return Alert(
        "TrainingStalled", STALL_SUSPECT, "critical", "training",
        "Job {{ $labels.training_job }} stalled; rank {{ $labels.rank }} stopped first",
        "No rank of job {{ $labels.training_job }} has finished a step for longer than "
        f"{cfg['step_time_factor']}x its recent median step time (at least {cfg['floor_seconds']}"
        " s), while its processes are alive. Rank {{ $labels.rank }} on {{ $labels.node }} is "
        "where it stopped first: it did not enter the collective its peers wait in, or its "
        "heartbeat stopped, or (when nothing tells the ranks apart) it is at the job's lowest "
        "step. Trainwatch collects per-rank stacks and flight-recorder traces automatically "
        "(stalled_job_diagnostics playbook; the audit record names the rank that did not "
        "enter the collective); read them, then restart the job from its last checkpoint.",
        for_=cfg["for"],
    )


def _vanished(p: Profile) -> Alert:
    cfg = p.alert("TrainingJobVanished")
    training = p.selector("training")
    window = cfg["remember_for"]
    beat = sel(catalog.TRAINING_HEARTBEAT_TIMESTAMP, training)
    finished = sel(catalog.TRAINING_FINISHED, training)
    up = sel("up", training)
    # max_over_time keeps the job in view after the exporter drops its series; an exporter
    # that is down is TargetDown's, not a vanished job. Aggregated, the window is scanned
    # over one recorded series per job and node instead of one per rank (the max over time
    # of the max over ranks is the max over ranks of the max over time).
    if aggregated(p):
        beat = HEARTBEAT_MAX_INSTANCE
    expr = (f"time() - max by (training_job) (\n  max_over_time({beat}[{window}])\n"
            f"  and on (instance) {up} == 1\n) > {cfg['after_seconds']}\n"
            f"unless on (training_job)\n"
            f"min by (training_job) (last_over_time({finished}[{window}])) == 1")
    return Alert(
        "TrainingJobVanished", expr, "critical", "training",
        "Job {{ $labels.training_job }} vanished without finishing",
        "No rank of job {{ $labels.training_job }} has sent a heartbeat for "
        "{{ $value | humanizeDuration }}, and not every rank reported a clean finish: the job "
        "was killed (OOM killer, preemption, node loss, a crashed launcher). Check the "
        "scheduler's record and the last log lines of each rank, then restart it from its "
        "last checkpoint.",
        for_=cfg["for"],
    )


def _straggler(p: Profile) -> Alert:
    cfg = p.alert("TrainingStragglerRank")
    median = recording.STEP_TIME_MEDIAN_RANK
    threshold = (f"({cfg['factor']} * {median} >= {median} + {cfg['min_delta_seconds']})\n"
                 f"  or\n  ({median} + {cfg['min_delta_seconds']})")
    expr = (f"{recording.STEP_TIME_PER_RANK}\n> on (training_job) group_left ()\n"
            f"(\n  {threshold}\n)\n"
            f"and on (training_job)\n{recording.RANKS_REPORTING} >= {cfg['min_ranks']}")
    return Alert(
        "TrainingStragglerRank", expr, "warning", "training",
        f"Straggler: {JOB_RANK} is slower than its peers",
        "Rank {{ $labels.rank }} of job {{ $labels.training_job }} on {{ $labels.node }} "
        f"takes {{{{ $value | printf \"%.3g\" }}}} s per "
        f"step, more than {cfg['factor']:g}x the median rank of the job. Every synchronous "
        "step waits for it. Check that node's GPU (throttling, errors) and its data loading.",
        for_=cfg["for"],
    )


def _log_event(p: Profile, name: str, kind: str, severity: str, title: str, what: str,
               advice: str) -> Alert:
    cfg = p.alert(name)
    events = sel(catalog.LOG_EVENTS, p.selector("logscan"), f'kind="{kind}"')
    return Alert(
        name, new_events(events, cfg["window"]), severity, "training",
        f"{title} in {JOB_RANK}",
        f"The log scanner found {what} in the logs of {JOB_RANK} within the last "
        f"{cfg['window']}. {advice}",
        for_=cfg["for"],
    )


def _alert_records(p: Profile) -> list[Record]:
    """Recordings the alerts of this group read, evaluated first in the same group so that
    the alerts see this round's values (no lag against reading the raw series)."""
    if not aggregated(p):
        return []
    beat = sel(catalog.TRAINING_HEARTBEAT_TIMESTAMP, p.selector("training"))
    return [Record(HEARTBEAT_MAX_INSTANCE, f"max by (training_job, instance) ({beat})")]


def groups(p: Profile) -> list[Group]:
    assert {"cuda_oom", "nccl_timeout", "nccl_error"} <= set(catalog.LOG_EVENT_KINDS)
    alerts: list[Alert | Record] = [
        *_alert_records(p),
        _loss_spike(p),
        _nonfinite(p),
        _grad_norm(p),
        _throughput(p),
        _stalled(p),
        _vanished(p),
        _straggler(p),
        _log_event(p, "TrainingCudaOom", "cuda_oom", "warning",
                   "CUDA out-of-memory error", "a CUDA out-of-memory error",
                   "That rank crashed or will retry; lower the micro-batch size or enable "
                   "activation checkpointing before restarting."),
        _log_event(p, "TrainingNcclTimeout", "nccl_timeout", "critical",
                   "NCCL timeout", "an NCCL timeout",
                   "A collective waited past its timeout: one rank is hung, dead or cut off. "
                   "Find the rank that stopped stepping first and check its node and network."),
        _log_event(p, "TrainingNcclError", "nccl_error", "critical",
                   "NCCL error", "an NCCL error",
                   "A collective failed (network, InfiniBand or a peer crashed); the job will "
                   "abort. Check the node's network links and the peer ranks' logs."),
    ]
    return [Group("trainwatch-training-stall.rules", _stall_records(p)),
            Group("trainwatch-training.alerts", alerts)]
