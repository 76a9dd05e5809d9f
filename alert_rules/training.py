"""Training alerts: the job's own signals (loss, gradients, throughput, progress, ranks, logs).

Every training alert keeps `training_job`, so Alertmanager groups per job and the
remediation service knows which job to act on.
"""

from __future__ import annotations

from typing import Any

from alert_rules import recording
from alert_rules.config import Profile, seconds
from alert_rules.model import Alert, Group, Record, alert_groups
from alert_rules.promql import new_events, sel
from trainwatch.exporters.contract import catalog

JOB_RANK = "job {{ $labels.training_job }} rank {{ $labels.rank }}"


# Per rank, recorded every slow_interval (aggregate_per_job_and_node): the spike alerts'
# thresholds, which move as slowly as their 30-minute baselines.
LOSS_BASELINE = "training_job_rank:training_loss:baseline_mean"
GRAD_NORM_LIMIT = "training_job_rank:training_grad_norm:explosion_threshold"


def _baseline(p: Profile, metric: str, cfg: dict[str, Any]) -> tuple[str, str, str]:
    """(series, its mean over a window that ended `baseline_offset` ago, enough samples).

    The offset keeps the spike out of its own baseline. A series without enough baseline
    samples (job start, restart) yields nothing, so a fresh job cannot fire. The exporter
    serves the loss and gradient norm only while finite (catalog `finite`): one NaN sample
    would make this mean NaN, and every comparison with it false, for the whole window; a
    gap leaves the mean of the finite samples (and one sample fewer to count).
    """
    series = sel(metric, p.selector("training"))
    past = f"[{cfg['baseline_window']}] offset {cfg['baseline_offset']}"
    return (series, f"avg_over_time({series}{past})",
            f"count_over_time({series}{past}) >= {cfg['baseline_min_samples']}")


def _loss_margin(cfg: dict[str, Any], baseline: str) -> str:
    """How far above its baseline a loss spikes: (factor - 1) x |baseline| (so negative
    losses work), and at least min_delta (tiny losses)."""
    return f"clamp_min({cfg['factor'] - 1} * abs({baseline}), {cfg['min_delta']})"


def _grad_limit(cfg: dict[str, Any], baseline: str) -> str:
    """factor x the baseline, and at least min_value."""
    return f"clamp_min({cfg['factor']} * {baseline}, {cfg['min_value']})"


def _baseline_records(p: Profile) -> list[Record]:
    """The spike alerts' per-rank loss baseline and gradient-norm threshold: 30-minute
    windows ending `baseline_offset` ago, recorded every `baseline_every` (5m: they move by a
    sixth per recording) instead of scanned every round; the alerts compare this round's
    value with the newest recording (`recorded_baseline`). Reading 30 minutes of every rank's
    loss and gradient norm is, with the step-time histogram, the costliest read of all."""
    loss_cfg, grad_cfg = p.alert("TrainingLossSpike"), p.alert("TrainingGradNormExplosion")
    _, loss_mean, loss_enough = _baseline(p, catalog.TRAINING_LOSS, loss_cfg)
    _, grad_mean, grad_enough = _baseline(p, catalog.TRAINING_GRAD_NORM, grad_cfg)
    return [
        Record(LOSS_BASELINE, f"{loss_mean}\nand\n{loss_enough}"),
        Record(GRAD_NORM_LIMIT, f"{_grad_limit(grad_cfg, grad_mean)}\nand\n{grad_enough}"),
    ]


def recorded_baseline(p: Profile, name: str) -> str:
    """A baseline recorded every baseline_every: its newest value within two recordings (an
    instant read could miss one recorded exactly five minutes ago)."""
    return f"last_over_time({name}[{_twice(str(p.values['baseline_every']))}])"


def _loss_spike(p: Profile) -> Alert:
    cfg = p.alert("TrainingLossSpike")
    series, mean, enough = _baseline(p, catalog.TRAINING_LOSS, cfg)
    # the value is the loss minus its baseline; above max(k x |baseline|, min_delta).
    # Aggregated, the baseline is the recorded one (the margin is computed here: a recorded
    # threshold would cost one more read of every rank's series per minute, and the alert
    # would still read the baseline for its value)
    if p.aggregate:
        baseline = recorded_baseline(p, LOSS_BASELINE)
        expr = f"{series} - {baseline}\n> {_loss_margin(cfg, baseline)}"
    else:
        expr = f"{series} - {mean} > {_loss_margin(cfg, mean)}\nand\n{enough}"
    return Alert(
        "TrainingLossSpike", expr, "warning",
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
    series, mean, enough = _baseline(p, catalog.TRAINING_GRAD_NORM, cfg)
    if p.aggregate:
        expr = f"{series} > {recorded_baseline(p, GRAD_NORM_LIMIT)}"
    else:
        expr = f"{series} > {_grad_limit(cfg, mean)}\nand\n{enough}"
    return Alert(
        "TrainingGradNormExplosion", expr, "warning", "training",
        f"Gradient norm explosion in {JOB_RANK}",
        f"The gradient norm of {JOB_RANK} is {{{{ $value | printf \"%.3g\" }}}}, more than "
        f"{cfg['factor']:g}x its recent mean. A loss spike or NaN usually follows. Trainwatch "
        "cuts the learning rate automatically (lr_reduction playbook); check gradient clipping "
        "and the data batch at this step.",
        for_=cfg["for"],
    )


def _nonfinite(p: Profile) -> Alert:
    cfg = p.alert("TrainingNonFiniteLoss")
    counter = sel(catalog.TRAINING_NONFINITE_LOSS, p.selector("training"))
    # The counter alone, with and without the aggregation: the exporter counts every
    # non-finite loss it receives, whatever the client counted, and serves the counter from
    # the first (new_events catches a counter born at 1), so the read costs nothing until
    # then. The loss gauge never holds NaN or Inf (catalog `finite`: it would blind the spike
    # baselines), so there is nothing to read there.
    return Alert(
        "TrainingNonFiniteLoss", new_events(counter, cfg["window"]), "critical", "training",
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
    if p.aggregate:  # the job's newest step, per job and node from the exporters, recorded
        stepping = f"{PROGRESS_AGE} < {seconds(p.rate_window):g}"
    else:
        stepping = f"{recording.job_stepping(p)} > 0"
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
STALL_SUSPECT = "training_job_rank:training_progress:stall_suspect"
JOB_STALLED = "training_job:training_progress:stalled"
# per rank of a stalled job (aggregate_per_job_and_node): its collective sequence, step and
# heartbeat, one series each (label `signal`); none while no job is stalled. Read from the
# exporters' stall evidence, which they expose only while a job's ranks stop stepping.
STALLED_INPUTS = "training_job_rank:training_progress:stalled_inputs"
# per rank of a stalled job: 3 heartbeat stopped, 2 behind its peers' collectives, 1 at the
# lowest step
STALL_PRIORITY = "training_job_rank:training_progress:stall_priority"
# per job: the lowest last `training_finished` of its ranks within `remember_for`
JOB_FINISHED = "training_job:training_finished:min_last_over_time"
# per rank of a job that went silent (TrainingJobVanished's condition): the rank whose
# heartbeat stopped first among those that did not say they ended on an error (a killed
# rank: its peers die of it after it stopped, and their monitors say so as they exit); the
# value is that heartbeat's Unix time
STOPPED_FIRST = "training_job_rank:training_heartbeat:stopped_first"
# per job and training exporter (`instance`) that still serves an earlier launch of the job
# than its newest (the job moved off that node; the exporter keeps the old launch's ranks until
# the job expires there): the newest heartbeat of that launch. The readers of every rank's
# series (the stall suspects, the rank that stopped first) leave those exporters out, so no
# alert names a rank of an incarnation other than the job's newest.
SUPERSEDED = "training_job_instance:training_stall_evidence:superseded"


def _superseded(p: Profile) -> Record:
    """The exporters still serving a launch of a job older than its newest one. A launch is
    the stall evidence's `incarnation` (the same id on every node of one launch); launches of
    one job run one after another, so the newest is the one whose ranks heartbeated last. Read
    from the evidence, which every exporter of a stopped job serves whatever the rules'
    aggregation; a node serves one launch of a job at a time, so the exporter names it."""
    beat = sel(catalog.TRAINING_STALL_EVIDENCE, p.selector("training"), 'signal="heartbeat"')
    return Record(SUPERSEDED,
                  f"max by (training_job, instance) (\n  {beat}\n"
                  f"  and on (training_job, incarnation)\n  (\n"
                  f"    max by (training_job, incarnation) ({beat})\n"
                  f"    < on (training_job) group_left ()\n"
                  f"    max by (training_job) ({beat})\n  )\n)")


def newest_launch(series: str) -> str:
    """`series` (a rank's) without those of exporters that serve an earlier launch of the
    job than its newest (SUPERSEDED)."""
    return f"({series}\nunless on (training_job, instance)\n{SUPERSEDED})"


def _twice(duration: str) -> str:
    """Twice a Prometheus duration, in seconds (a range that always holds one evaluation of
    a group run every `duration`)."""
    twice = int(2 * seconds(duration))
    return f"{twice // 60}m" if twice % 60 == 0 else f"{twice}s"


def _step_time_median(p: Profile) -> Record:
    """The job's median step time over step_time_window; NaN (no step in the window) is
    dropped by `> 0`, so the stall threshold falls to its floor."""
    cfg = p.alert("TrainingStalled")
    # every step of every rank: the exporters' per-node histograms hold the same buckets,
    # added up, one series per node and bucket instead of one per rank and bucket
    histogram = catalog.TRAINING_NODE_STEP_DURATION if p.aggregate else \
        catalog.TRAINING_STEP_DURATION
    bucket = sel(histogram + "_bucket", p.selector("training"))
    return Record(STEP_TIME_MEDIAN,
                  f"histogram_quantile(0.5, sum by (training_job, le) "
                  f"(rate({bucket}[{cfg['step_time_window']}]))) > 0")


def _stall_records(p: Profile) -> list[Record]:
    """A job is stalled when no rank has finished a step for max(N x its own recent median
    step time, a floor) while its ranks are still alive (heartbeating); the suspects are the
    ranks that stopped first: those that did not enter the collective their peers are waiting
    in, or whose heartbeat stopped; failing both, those at the lowest step."""
    cfg = p.alert("TrainingStalled")
    training = p.selector("training")
    last = sel(catalog.TRAINING_LAST_STEP_TIMESTAMP, training)
    beat = sel(catalog.TRAINING_HEARTBEAT_TIMESTAMP, training)
    if p.aggregate:  # the exporters' newest per job and node: max of maxima, one per node
        last = sel(catalog.TRAINING_NODE_LAST_STEP_TIMESTAMP, training)
        beat = sel(catalog.TRAINING_NODE_HEARTBEAT_TIMESTAMP, training)
    floor = cfg["floor_seconds"]
    median = STEP_TIME_MEDIAN
    if p.aggregate:  # recorded every step_time_every: the newest value within two of them
        median = f"last_over_time({STEP_TIME_MEDIAN}[{_twice(cfg['step_time_every'])}])"
    stalled = (f"{PROGRESS_AGE} > on (training_job) {STALL_THRESHOLD}\n"
               f"and on (training_job) {HEARTBEAT_AGE_JOB} < {cfg['heartbeat_stale_seconds']}")
    return [
        _superseded(p),
        # with the aggregation, the median step time is a slow-moving baseline of its own group
        *([] if p.aggregate else [_step_time_median(p)]),
        Record(PROGRESS_AGE, f"time() - max by (training_job) ({last})"),
        # the floor for every job with a last step (PROGRESS_AGE: one series per such job)
        Record(STALL_THRESHOLD,
               f"clamp_min({cfg['step_time_factor']} * {median}, {floor})\n"
               f"or on (training_job)\n0 * {PROGRESS_AGE} + {floor}"),
        Record(HEARTBEAT_AGE_JOB, f"time() - max by (training_job) ({beat})"),
        *(_suspects_per_job(p, stalled) if p.aggregate else [_suspects_flat(p, stalled)]),
        _stopped_first(p),
    ]


def _stopped_first(p: Profile) -> Record:
    """Per silent job (every rank's heartbeat older than TrainingJobVanished's
    after_seconds) whose ranks died of something (some rank's monitor said it ended without a
    clean finish: a collective raised because a peer was gone), the rank that did not say
    so and whose heartbeat stopped first: a rank killed (SIGKILL, the OOM killer) sends
    nothing. A job killed whole sends no such word from any rank and names nobody.
    Aggregated, the ranks' heartbeats and exits come from the exporters' stall evidence,
    served for a job whose ranks stopped stepping until the job expires (none while every
    job steps). Only the job's newest launch counts: after the job moved nodes, an old node
    still serves the earlier launch's ranks, whose heartbeats stopped before any of the newest
    launch's."""
    training = p.selector("training")
    if p.aggregate:
        beat = sel(catalog.TRAINING_STALL_EVIDENCE, training, 'signal="heartbeat"')
        exited = sel(catalog.TRAINING_STALL_EVIDENCE, training, 'signal="exited"')
    else:
        beat = sel(catalog.TRAINING_HEARTBEAT_TIMESTAMP, training)
        exited = sel(catalog.TRAINING_EXITED, training)
    beat, exited = newest_launch(beat), newest_launch(exited) + " == 1"
    silent = f"({beat} unless on (training_job, rank) {exited})"
    after = p.alert("TrainingJobVanished")["after_seconds"]
    return Record(STOPPED_FIRST,
                  f"max without (signal, incarnation) (\n  {silent}\n"
                  f"  == on (training_job) group_left ()\n"
                  f"  min by (training_job) {silent}\n)\n"
                  f"and on (training_job)\ncount by (training_job) ({exited})\n"
                  f"and on (training_job)\n{HEARTBEAT_AGE_JOB} > {after}")


def _elsewhere(collective: str) -> str:
    """Ranks inside another collective than most of their job's ranks, or inside none while
    most are inside one: each rank's collective id (equal on every rank inside the same
    collective, on any process group; 0 for none) counted among the job's ranks, and the
    ranks whose id fewer ranks share than the job's most common one. A rank stuck outside
    every collective while its peers wait on a group other than the default one (a
    checkpoint's), or stuck in another collective than its peers (another group, or another
    operation at the same place), is told apart by this where the default group's sequence
    numbers are equal. A tie (2 ranks, 1 against 1) names nobody."""
    shared = (f"count_values without (signal) (\"collective_id\", {collective})\n"
              f"  * on (training_job, collective_id) group_left ()\n"
              f"  count_values by (training_job) (\"collective_id\", {collective})")
    return (f"max without (collective_id) (\n  {shared}\n  < on (training_job) group_left ()"
            f"\n  max by (training_job) (\n  {shared}\n  )\n)")


def _suspect_parts(p: Profile, seq: str, step: str, beat: str, collective: str, seq_max: str,
                   step_min: str) -> tuple[str, str, str]:
    """(ranks whose heartbeat stopped: stopped by a signal or killed; ranks behind in
    collectives or inside another collective than most of their peers; ranks at the lowest
    step), from each rank's collective sequence, step, heartbeat and collective id series.
    The first kind outranks the second: a stopped rank may have queued collectives before it
    stopped, so the peers it blocks can look behind it (with half the ranks stopped, the
    waiting half)."""
    behind = f"{seq} < on (training_job) group_left () {seq_max}"
    silent = f"{beat} < time() - {p.alert('TrainingStalled')['heartbeat_stale_seconds']}"
    return (f"({silent})", f"(({behind}) or ({_elsewhere(collective)}))",
            f"({step} == on (training_job) group_left () {step_min})")


def _suspects_flat(p: Profile, stalled: str) -> Record:
    """The suspects without per-job recordings (the rules as they were)."""
    training = p.selector("training")
    seq, step, beat, collective = (newest_launch(sel(metric, training)) for metric in (
        catalog.TRAINING_COLLECTIVE_SEQ, catalog.TRAINING_STEP,
        catalog.TRAINING_HEARTBEAT_TIMESTAMP, catalog.TRAINING_COLLECTIVE_ID))
    silent, first, lowest = _suspect_parts(p, seq, step, beat, collective,
                                           f"max by (training_job) ({seq})",
                                           f"min by (training_job) ({step})")
    # `and`/`unless` bind tighter than `or`: the ranks behind only when no rank is silent,
    # the lowest-step ranks only when no rank is either
    return Record(STALL_SUSPECT,
                  f"(\n  {silent} * 0 + 1\n  or\n  {first} * 0 + 1\n"
                  f"  unless on (training_job) {silent}\n  or\n  {lowest} * 0 + 1\n"
                  f"  unless on (training_job) ({silent} or {first})\n)\n"
                  f"and on (training_job)\n({stalled})")


def _suspects_per_job(p: Profile, stalled: str) -> list[Record]:
    """Every rank's collective sequence, step and heartbeat, as the exporters' stall evidence
    (one series per rank and signal, exposed only while the job's ranks on a node have
    stopped stepping: none while every job steps), narrowed to the stalled jobs and
    recorded; everything after that (the job's highest sequence and lowest step, a priority
    of 3 for ranks whose heartbeat stopped, 2 for ranks behind their peers' collectives and 1
    for the lowest step, the suspects: the ranks with
    their job's highest priority) reads that recording. Prometheus reads a selector's every
    series whatever follows it, so reading a series that exists only when needed, instead of
    every rank's three series every round, is what saves the time."""
    evidence = sel(catalog.TRAINING_STALL_EVIDENCE, p.selector("training"))
    # the newest launch's ranks only, without the launch's id (the alerts' labels are the
    # same with and without the aggregation)
    inputs = (f"max without (incarnation) (\n  {evidence}\n  and on (training_job)\n"
              f"  {JOB_STALLED}\n  unless on (training_job, instance)\n  {SUPERSEDED}\n)")
    seq, step, beat, collective = (f'{STALLED_INPUTS}{{signal="{signal}"}}'
                                   for signal in ("seq", "step", "heartbeat", "collective"))
    silent, first, lowest = _suspect_parts(p, seq, step, beat, collective,
                                           f"max by (training_job) ({seq})",
                                           f"min by (training_job) ({step})")
    return [
        Record(JOB_STALLED, stalled),
        Record(STALLED_INPUTS, inputs),
        Record(STALL_PRIORITY, f"max without (signal) (\n  {silent} * 0 + 3\n  or\n"
                               f"  {first} * 0 + 2\n  or\n  {lowest} * 0 + 1\n)"),
        Record(STALL_SUSPECT,
               f"(\n  {STALL_PRIORITY}\n  == on (training_job) group_left ()\n"
               f"  max by (training_job) ({STALL_PRIORITY})\n) * 0 + 1"),
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
    up = sel("up", training)
    # max_over_time keeps the job in view after the exporter drops its series; an exporter
    # that is down is TargetDown's, not a vanished job. Aggregated, the window is scanned
    # over the exporters' one series per job and node instead of one per rank (the max over
    # time of the max over ranks is the max over ranks of the max over time).
    # Aggregated, whether every rank finished is recorded every slow_interval: it can only be
    # that much late to suppress the alert, which needs `for` more after after_seconds.
    finished_all = _job_finished(p)
    if p.aggregate:
        beat = sel(catalog.TRAINING_NODE_HEARTBEAT_TIMESTAMP, training)
        finished_all = JOB_FINISHED
    job = (f"(\n  time() - max by (training_job) (\n    max_over_time({beat}[{window}])\n"
           f"    and on (instance) {up} == 1\n  ) > {cfg['after_seconds']}\n"
           f"  unless on (training_job)\n  {finished_all} == 1\n)")
    # the rank that stopped first, remembered as long as the job is (its evidence goes with
    # the job's series); the newest such rank of the job name (an earlier launch's is older)
    named = f"last_over_time({STOPPED_FIRST}[{window}])"
    newest = f"{named}\n  == on (training_job) group_left ()\n  max by (training_job) ({named})"
    expr = (f"{job}\n* on (training_job) group_right ()\n(0 * (\n  {newest}\n) + 1)\n"
            f"or on (training_job)\n{job}")
    return Alert(
        "TrainingJobVanished", expr, "critical", "training",
        "Job {{ $labels.training_job }} vanished without finishing"
        "{{ if $labels.rank }}; rank {{ $labels.rank }} stopped first{{ end }}",
        "No rank of job {{ $labels.training_job }} has sent a heartbeat for "
        "{{ $value | humanizeDuration }}, and not every rank reported a clean finish: the job "
        "was killed (OOM killer, preemption, node loss, a crashed launcher)."
        "{{ if $labels.rank }} Rank {{ $labels.rank }} on {{ $labels.node }} stopped first "
        "(its heartbeat stopped before its peers'): a rank killed alone takes the job down "
        "with it.{{ end }} Check the scheduler's record and the last log lines of each rank, "
        "then restart it from its last checkpoint.",
        for_=cfg["for"],
    )


def _job_finished(p: Profile) -> str:
    """1 when every rank of the job reported a clean finish in its last sample within
    TrainingJobVanished's memory."""
    window = p.alert("TrainingJobVanished")["remember_for"]
    finished = sel(catalog.TRAINING_FINISHED, p.selector("training"))
    return f"min by (training_job) (last_over_time({finished}[{window}]))"


def _straggler(p: Profile) -> Alert:
    """A rank whose own compute time per step (step time minus time waiting in collectives,
    exporters/rank/collectives.py OwnCompute) is more than `factor` x the job's median
    rank and at least min_delta_seconds more. Step times cannot tell: in synchronous
    training every rank waits for the slowest, so every rank's step takes as long; what a
    rank spends before entering the collective is its own work (NVIDIA's straggler detection
    scores ranks on it against the job's median for that reason). An evenly slow job has no
    rank above its median. Aggregated, the exporters' per-node median and slowest rank are
    read (the job's median is the median of its nodes' medians; a second straggler on the
    node of the first is named once the first is gone), not every rank's series."""
    cfg = p.alert("TrainingStragglerRank")
    training = p.selector("training")
    if p.aggregate:
        ranks = sel(catalog.TRAINING_NODE_COMPUTE_SLOWEST, training)
        median = (f"quantile by (training_job) (0.5, "
                  f"{sel(catalog.TRAINING_NODE_COMPUTE_MEDIAN, training)})")
        counted = (f"sum by (training_job) "
                   f"({sel(catalog.TRAINING_NODE_COMPUTE_RANKS, training)})")
    else:
        ranks = sel(catalog.TRAINING_COMPUTE, training)
        median = f"quantile by (training_job) (0.5, {ranks})"
        counted = f"count by (training_job) ({ranks})"
    delta = cfg["min_delta_seconds"]
    threshold = (f"({cfg['factor']} * {median} >= {median} + {delta})\n"
                 f"  or\n  ({median} + {delta})")
    expr = (f"{ranks}\n> on (training_job) group_left ()\n(\n  {threshold}\n)\n"
            f"and on (training_job)\n{counted} >= {cfg['min_ranks']}")
    return Alert(
        "TrainingStragglerRank", expr, "warning", "training",
        f"Straggler: {JOB_RANK} is slower than its peers",
        "Rank {{ $labels.rank }} of job {{ $labels.training_job }} on {{ $labels.node }} "
        f"computes for {{{{ $value | printf \"%.3g\" }}}} s per step before entering its "
        f"collectives, more than {cfg['factor']:g}x the median rank of the job. Every "
        "synchronous step waits for it, so every rank's step time is as long as its own. "
        "Check that node's GPU (throttling, errors), its data loading and its CPU.",
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


def groups(p: Profile) -> list[Group]:
    assert {"cuda_oom", "nccl_timeout", "nccl_error"} <= set(catalog.LOG_EVENT_KINDS)
    alerts: list[Alert] = [
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
    baselines = ([Group("trainwatch-training-baselines.rules", _baseline_records(p),
                        str(p.values["baseline_every"])),
                  # whether every rank finished: TrainingJobVanished's suppression, which a
                  # job that just finished needs within the alert's after_seconds + `for`
                  Group("trainwatch-training-finished.rules", [Record(JOB_FINISHED,
                                                                      _job_finished(p))],
                        p.slow_interval),
                  Group("trainwatch-training-step-time.rules", [_step_time_median(p)],
                        p.alert("TrainingStalled")["step_time_every"])]
                 if p.aggregate else [])
    return [*baselines,
            Group("trainwatch-training-stall.rules", _stall_records(p)),
            *alert_groups("training", alerts, p.alert_interval, p.alert_group_suffix)]
