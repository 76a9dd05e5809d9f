"""Training job: one job's health per rank, for the ML engineer on call."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as gd

from alert_rules import recording
from dashboards.panels import (
    CLUSTER,
    SCOPE,
    Q,
    add_panels,
    holders_of,
    instance_label_variable,
    logs_datasource_variable,
    logs_panel,
    query_variable,
    ranks_shown_variable,
    scoped_dashboard,
    stat_panel,
    timeseries_panel,
    top_ranks,
)
from trainwatch.exporters.contract import catalog as c

UID = "trainwatch-training-job"
# training-exporter series
T = f'{SCOPE},training_job=~"$training_job",rank=~"$rank"'
# log-scanner series come from another scrape job and instance
LOGS = f'{CLUSTER},training_job=~"$training_job",rank=~"$rank"'
# recording rules aggregate by training_job
J = 'training_job=~"$training_job"'
RANK = "{{training_job}} rank {{rank}}"


def build() -> gd.Dashboard:
    dashboard = scoped_dashboard(
        UID, "Trainwatch / Training job",
        "One training job per rank: loss, learning rate, gradient norm, "
        "throughput, step time and stragglers.", ["training"],
        c.TRAINING_STEP,
        instance_label_variable("training_job", "Training job", c.TRAINING_STEP),
        query_variable(
            "rank", "Rank",
            f'label_values({c.TRAINING_STEP}{{training_job=~"$training_job"}}, rank)'),
        ranks_shown_variable(), logs_datasource_variable())
    return add_panels(
        dashboard,
        stat_panel("Step", "Highest step any selected rank reported.", "none",
                   Q(f"max({c.TRAINING_STEP}{{{T}}})")),
        stat_panel("World size", "Ranks the launcher started (WORLD_SIZE).", "none",
                   Q(f"max({c.TRAINING_WORLD_SIZE}{{{T}}})")),
        stat_panel("Restarts", "Restarts of the job reported by its launcher.", "none",
                   Q(f"max({c.TRAINING_RESTARTS}{{{T}}})")),
        stat_panel("Since last step", "Seconds since the newest step of any selected rank; "
                   "TrainingStalled fires when this stays high.", "s",
                   Q(f"time() - max({c.TRAINING_LAST_STEP_TIMESTAMP}{{{T}}})")),
        timeseries_panel("Loss per rank", "Training loss each rank reported at its last step. "
                         "A spike on all ranks is divergence; on one rank, its data or GPU.",
                         "none", Q(top_ranks(f"{c.TRAINING_LOSS}{{{T}}}"), RANK)),
        timeseries_panel("Learning rate", "Learning rate per rank; Trainwatch's lr_reduction "
                         "playbook shows as a step down on every rank at the same step.", "sci",
                         Q(f"{c.TRAINING_LEARNING_RATE}{{{T}}}", RANK)),
        timeseries_panel("Gradient norm", "Global gradient norm per rank; explosions usually "
                         "come before loss spikes.", "none",
                         Q(top_ranks(f"{c.TRAINING_GRAD_NORM}{{{T}}}"), RANK)),
        timeseries_panel("Throughput", "Samples and tokens per second over all selected ranks.",
                         "short",
                         Q(f"sum by (training_job) (rate({c.TRAINING_SAMPLES}{{{T}}}"
                           f"[$__rate_interval]))", "{{training_job}} samples/s"),
                         Q(f"sum by (training_job) (rate({c.TRAINING_TOKENS}{{{T}}}"
                           f"[$__rate_interval]))", "{{training_job}} tokens/s")),
        timeseries_panel("Model FLOP/s per rank", "Achieved model FLOP/s (forward + backward "
                         "FLOPs of the samples or tokens processed, as the job declared them "
                         "with set_model_flops) per rank.", "flops",
                         Q(top_ranks(f'{recording.FLOPS_PER_RANK}{{{J},rank=~"$rank"}}',
                                     lowest=True), RANK)),
        timeseries_panel("MFU", "Model FLOPs utilisation: achieved model FLOP/s over the GPU's "
                         "dense peak for the job's dtype (datasheet table in "
                         "exporters/rank/flops.py, or the job's override). 40-60% is good "
                         "for large transformers; absent for ranks without a known peak (CPU).",
                         "percentunit",
                         Q(top_ranks(f'{recording.MFU_PER_RANK}{{{J},rank=~"$rank"}}',
                                     lowest=True), RANK),
                         Q(f"{recording.MFU_PER_JOB}{{{J}}}", "{{training_job}} job"),
                         min_value=0),
        timeseries_panel("Step time per rank", "Mean wall time of one step per rank.", "s",
                         Q(top_ranks(f"rate({c.TRAINING_STEP_DURATION}_sum{{{T}}}"
                                     f"[$__rate_interval])\n"
                                     f"/\nrate({c.TRAINING_STEP_DURATION}_count{{{T}}}"
                                     f"[$__rate_interval])"), RANK)),
        timeseries_panel("Step time p90 per rank", "90th percentile step time per rank, from the "
                         "step-duration histogram.", "s",
                         Q(top_ranks(f"histogram_quantile(0.9, sum by (training_job, rank, le) "
                                     f"(rate({c.TRAINING_STEP_DURATION}_bucket{{{T}}}"
                                     f"[$__rate_interval])))"), RANK)),
        timeseries_panel("Straggler view: step time / job median", "Each rank's mean step time "
                         "divided by the median rank of its job. 1 = typical. In synchronous "
                         "training every rank waits for the slowest, so step times stay "
                         "equal; TrainingStragglerRank reads each rank's own compute time "
                         "(training_compute_seconds) instead.", "none",
                         Q(top_ranks(f'{recording.STEP_TIME_PER_RANK}{{{J},rank=~"$rank"}}\n'
                                     f"/ on (training_job) group_left ()\n"
                                     f"{recording.STEP_TIME_MEDIAN_RANK}{{{J}}}"), RANK)),
        timeseries_panel("Data wait", "Seconds the last step waited for its input batch; high "
                         "means the input pipeline is the bottleneck.", "s",
                         Q(top_ranks(f"{c.TRAINING_DATA_WAIT}{{{T}}}"), RANK)),
        timeseries_panel("CUDA memory", "Memory allocated by tensors and reserved by PyTorch's "
                         "caching allocator, per rank.", "bytes",
                         Q(f"{c.TRAINING_CUDA_MEM_ALLOCATED}{{{T}}}", RANK + " allocated"),
                         Q(f"{c.TRAINING_CUDA_MEM_RESERVED}{{{T}}}", RANK + " reserved")),
        timeseries_panel("Non-finite losses", "Steps whose loss was NaN or infinite, per rank "
                         "(TrainingNonFiniteLoss), and how many ranks had one (the counter "
                         "exists from a rank's first).", "none",
                         Q(f"increase({c.TRAINING_NONFINITE_LOSS}{{{T}}}[$__rate_interval])",
                           RANK),
                         Q(holders_of(f"{c.TRAINING_NONFINITE_LOSS}{{{T}}}",
                                      "training_job, rank"), "ranks with one"), min_value=0),
        timeseries_panel("Log events", "Anomalies the log scanner found in the ranks' logs, by "
                         "kind (CUDA OOM, NCCL timeout/error, XID, ...).", "none",
                         Q(f"sum by (training_job, rank, kind) (increase({c.LOG_EVENTS}"
                           f"{{{LOGS}}}[$__rate_interval]))", RANK + " {{kind}}"), min_value=0),
        timeseries_panel("Commands applied and rollbacks", "Control commands (scale_lr, "
                         "rollback, ...) applied per rank, and checkpoint rollbacks.", "none",
                         Q(f"sum by (training_job, rank, command) (increase("
                           f"{c.TRAINING_COMMANDS_APPLIED}{{{T}}}[$__rate_interval]))",
                           RANK + " {{command}}"),
                         Q(f"increase({c.TRAINING_ROLLBACKS}{{{T}}}[$__rate_interval])",
                           RANK + " rollbacks"), min_value=0),
        logs_panel("Logs of the selected ranks", "The ranks' own log lines (ECS JSON through "
                   "Filebeat and Logstash into Elasticsearch), newest first: what the job said "
                   "around a spike, a stall or a failed remediation.",
                   "labels.training_job:${training_job:lucene} AND labels.rank:${rank:lucene}"),
        timeseries_panel("Dropped step reports", "Step reports a rank could not hand to the "
                         "exporter (buffer full or exporter down); training never waits.", "ops",
                         Q(f"rate({c.TRAINING_DROPPED_SAMPLES}{{{T}}}[$__rate_interval])",
                           RANK), min_value=0),
    )
