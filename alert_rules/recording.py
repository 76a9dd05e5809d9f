"""Recording rules (level:metric:operations) that alerts and dashboards share."""

from __future__ import annotations

from alert_rules.config import Profile, seconds
from alert_rules.model import Group, Record
from alert_rules.promql import sel
from trainwatch.exporters.contract import catalog

STEP_TIME_PER_RANK = "training_job_rank:training_step_duration_seconds:rate_mean"
STEP_TIME_MEDIAN_RANK = "training_job:training_step_duration_seconds:median_over_ranks"
RANKS_REPORTING = "training_job:training_step_duration_seconds:count_ranks"
SAMPLES_RATE = "training_job:training_samples:rate"
TOKENS_RATE = "training_job:training_tokens:rate"
# MFU (exporters/rank/flops.py): achieved model FLOP/s and its share of the GPUs' peak
FLOPS_PER_RANK = "training_job_rank:training_model_flops:rate"
FLOPS_PER_JOB = "training_job:training_model_flops:rate"
MFU_PER_RANK = "training_job_rank:training_mfu:ratio"
MFU_PER_JOB = "training_job:training_mfu:ratio"
GPU_MEMORY_USED_RATIO = "instance_gpu:trainwatch_gpu_memory_used_bytes:ratio"
# name-spaced (model.Record): node-mixin and kube-prometheus-stack record
# instance:node_memory_utilisation:ratio themselves, from other series and labels
NODE_MEMORY_UTILISATION = "instance:trainwatch_node_memory_utilisation:ratio"
# per node: jobs whose ranks there stepped within GpuUtilizationLowWhileTraining's window
STEPPING_JOBS = "instance:training_progress:stepping_jobs"
# per GPU: utilization averaged over GpuUtilizationLowWhileTraining's window
GPU_UTILIZATION_AVG = "instance_gpu:trainwatch_gpu_utilization_ratio:avg_over_time"

ALL = (STEP_TIME_PER_RANK, STEP_TIME_MEDIAN_RANK, RANKS_REPORTING, SAMPLES_RATE, TOKENS_RATE,
       FLOPS_PER_RANK, FLOPS_PER_JOB, MFU_PER_RANK, MFU_PER_JOB,
       GPU_MEMORY_USED_RATIO, NODE_MEMORY_UTILISATION)


def stepping(p: Profile) -> str:
    """Ranks whose step changed within GpuUtilizationLowWhileTraining's window."""
    window = p.alert("GpuUtilizationLowWhileTraining")["window"]
    return f"changes({sel(catalog.TRAINING_STEP, p.selector('training'))}[{window}]) > 0"


def gpu_utilization_avg(p: Profile) -> str:
    window = p.alert("GpuUtilizationLowWhileTraining")["window"]
    return f"avg_over_time({sel(catalog.GPU_UTILIZATION, p.selector('gpu'))}[{window}])"


def utilization_recorded(p: Profile) -> bool:
    """Whether GpuUtilizationLowWhileTraining reads a recorded per-GPU average: with the
    aggregation, unless the alert itself runs every slow_interval (its `for` is long), where
    averaging in the alert reads the same window once and writes nothing."""
    alert_for = p.alert("GpuUtilizationLowWhileTraining")["for"]
    return p.aggregate and p.alert_interval(alert_for) is None


def job_stepping(p: Profile) -> str:
    """Per job: the most steps any rank made within the rate window (> 0: still stepping)."""
    step = sel(catalog.TRAINING_STEP, p.selector("training"))
    return f"max by (training_job) (changes({step}[{p.rate_window}]))"


def stepping_jobs(p: Profile) -> str:
    """Per node: the jobs whose ranks there stepped within GpuUtilizationLowWhileTraining's
    window, from the exporters' newest step per job and node (one series per node, where
    `stepping` reads a window of every rank's step)."""
    window = seconds(p.alert("GpuUtilizationLowWhileTraining")["window"])
    newest = sel(catalog.TRAINING_NODE_LAST_STEP_TIMESTAMP, p.selector("training"))
    return f"count by (instance) (time() - {newest} < {window:g})"


def groups(p: Profile) -> list[Group]:
    """Rates over the rate window and ratios for dashboards and the slower alerts. With the
    aggregation they run every `slow_interval` (their windows are 5 minutes and more, the
    alerts reading them wait 5 to 15 minutes), with the per-node and per-job counts those
    alerts read; alerts and recordings that read them sit in other groups, so they may see
    a value one slow_interval old (alert_rules/README.md)."""
    w = p.rate_window
    training = p.selector("training")
    duration = catalog.TRAINING_STEP_DURATION
    # the job's totals from the exporters' per-node sums (one series per node, not per rank)
    samples, tokens = ((catalog.TRAINING_NODE_SAMPLES, catalog.TRAINING_NODE_TOKENS)
                       if p.aggregate else (catalog.TRAINING_SAMPLES, catalog.TRAINING_TOKENS))
    training_rules = [
        # mean step time of each rank over the window (histogram sum / count)
        Record(STEP_TIME_PER_RANK,
               f"rate({sel(duration + '_sum', training)}[{w}])\n"
               f"/\nrate({sel(duration + '_count', training)}[{w}])"),
        Record(STEP_TIME_MEDIAN_RANK,
               f"quantile by (training_job) (0.5, {STEP_TIME_PER_RANK})"),
        Record(RANKS_REPORTING, f"count by (training_job) ({STEP_TIME_PER_RANK})"),
        Record(SAMPLES_RATE, f"sum by (training_job) (rate({sel(samples, training)}[{w}]))"),
        Record(TOKENS_RATE, f"sum by (training_job) (rate({sel(tokens, training)}[{w}]))"),
        *mfu_rules(p),
    ]
    if p.aggregate:
        training_rules.append(Record(STEPPING_JOBS, stepping_jobs(p)))
    infra_rules = [
        Record(GPU_MEMORY_USED_RATIO,
               f"{sel(catalog.GPU_MEMORY_USED, p.selector('gpu'))}\n"
               f"/\n{sel(catalog.GPU_MEMORY_TOTAL, p.selector('gpu'))}"),
        Record(NODE_MEMORY_UTILISATION,
               f"1 - {sel(catalog.NODE_MEM_AVAILABLE, p.selector('node'))}\n"
               f"/\n{sel(catalog.NODE_MEM_TOTAL, p.selector('node'))}"),
    ]
    if utilization_recorded(p):
        infra_rules.append(Record(GPU_UTILIZATION_AVG, gpu_utilization_avg(p)))
    return [Group("trainwatch-training.rules", training_rules, p.slow_interval),
            Group("trainwatch-infra.rules", infra_rules, p.slow_interval)]


def mfu_rules(p: Profile) -> list[Record]:
    """Achieved model FLOP/s per rank and job, and MFU = achieved / peak of the rank's GPU for
    its dtype. The peak comes from the rank (datasheet table or the job's override); a rank
    without one (CPU, unlisted GPU) has FLOP/s but no MFU, and counts in neither side of the
    job's ratio."""
    training = p.selector("training")
    peak = sel(catalog.TRAINING_PEAK_FLOPS, training)
    if p.aggregate:  # the exporters' per-node sums over the same ranks: one series per node
        node_flops = sel(catalog.TRAINING_NODE_MODEL_FLOPS, training)
        job_mfu = (f"sum by (training_job) (rate({node_flops}[{p.rate_window}]))\n"
                   f"/\nsum by (training_job) "
                   f"({sel(catalog.TRAINING_NODE_PEAK_FLOPS, training)})")
    else:
        job_mfu = (f"sum by (training_job) ({FLOPS_PER_RANK} and {peak})\n"
                   f"/\nsum by (training_job) ({peak} and {FLOPS_PER_RANK})")
    return [
        Record(FLOPS_PER_RANK,
               f"rate({sel(catalog.TRAINING_MODEL_FLOPS, training)}[{p.rate_window}])"),
        Record(FLOPS_PER_JOB, f"sum by (training_job) ({FLOPS_PER_RANK})"),
        Record(MFU_PER_RANK, f"{FLOPS_PER_RANK}\n/\n{peak}"),
        Record(MFU_PER_JOB, job_mfu),
    ]
