"""Recording rules (level:metric:operations) that alerts and dashboards share."""

from __future__ import annotations

from alert_rules import metric_names as m
from alert_rules.config import Profile
from alert_rules.model import Group, Record
from alert_rules.promql import sel
from exporters import catalog

STEP_TIME_PER_RANK = "training_job_rank:training_step_duration_seconds:rate_mean"
STEP_TIME_MEDIAN_RANK = "training_job:training_step_duration_seconds:median_over_ranks"
RANKS_REPORTING = "training_job:training_step_duration_seconds:count_ranks"
SAMPLES_RATE = "training_job:training_samples:rate"
TOKENS_RATE = "training_job:training_tokens:rate"
# MFU (exporters/training/flops.py): achieved model FLOP/s and its share of the GPUs' peak
FLOPS_PER_RANK = "training_job_rank:training_model_flops:rate"
FLOPS_PER_JOB = "training_job:training_model_flops:rate"
MFU_PER_RANK = "training_job_rank:training_mfu:ratio"
MFU_PER_JOB = "training_job:training_mfu:ratio"
GPU_MEMORY_USED_RATIO = "instance_gpu:trainwatch_gpu_memory_used_bytes:ratio"
NODE_MEMORY_UTILISATION = "instance:node_memory_utilisation:ratio"

ALL = (STEP_TIME_PER_RANK, STEP_TIME_MEDIAN_RANK, RANKS_REPORTING, SAMPLES_RATE, TOKENS_RATE,
       FLOPS_PER_RANK, FLOPS_PER_JOB, MFU_PER_RANK, MFU_PER_JOB,
       GPU_MEMORY_USED_RATIO, NODE_MEMORY_UTILISATION)


def groups(p: Profile) -> list[Group]:
    w = p.rate_window
    training = p.selector("training")
    duration = catalog.TRAINING_STEP_DURATION
    training_rules = [
        # mean step time of each rank over the window (histogram sum / count)
        Record(STEP_TIME_PER_RANK,
               f"rate({sel(duration + '_sum', training)}[{w}])\n"
               f"/\nrate({sel(duration + '_count', training)}[{w}])"),
        Record(STEP_TIME_MEDIAN_RANK,
               f"quantile by (training_job) (0.5, {STEP_TIME_PER_RANK})"),
        Record(RANKS_REPORTING, f"count by (training_job) ({STEP_TIME_PER_RANK})"),
        Record(SAMPLES_RATE,
               f"sum by (training_job) (rate({sel(catalog.TRAINING_SAMPLES, training)}[{w}]))"),
        Record(TOKENS_RATE,
               f"sum by (training_job) (rate({sel(catalog.TRAINING_TOKENS, training)}[{w}]))"),
        *mfu_rules(p),
    ]
    infra_rules = [
        Record(GPU_MEMORY_USED_RATIO,
               f"{sel(m.GPU_MEMORY_USED, p.selector('gpu'))}\n"
               f"/\n{sel(m.GPU_MEMORY_TOTAL, p.selector('gpu'))}"),
        Record(NODE_MEMORY_UTILISATION,
               f"1 - {sel(m.NODE_MEM_AVAILABLE, p.selector('node'))}\n"
               f"/\n{sel(m.NODE_MEM_TOTAL, p.selector('node'))}"),
    ]
    return [Group("trainwatch-training.rules", training_rules),
            Group("trainwatch-infra.rules", infra_rules)]


def mfu_rules(p: Profile) -> list[Record]:
    """Achieved model FLOP/s per rank and job, and MFU = achieved / peak of the rank's GPU for
    its dtype. The peak comes from the rank (datasheet table or the job's override); a rank
    without one (CPU, unlisted GPU) has FLOP/s but no MFU, and counts in neither side of the
    job's ratio."""
    training = p.selector("training")
    peak = sel(catalog.TRAINING_PEAK_FLOPS, training)
    return [
        Record(FLOPS_PER_RANK,
               f"rate({sel(catalog.TRAINING_MODEL_FLOPS, training)}[{p.rate_window}])"),
        Record(FLOPS_PER_JOB, f"sum by (training_job) ({FLOPS_PER_RANK})"),
        Record(MFU_PER_RANK, f"{FLOPS_PER_RANK}\n/\n{peak}"),
        Record(MFU_PER_JOB,
               f"sum by (training_job) ({FLOPS_PER_RANK} and {peak})\n"
               f"/\nsum by (training_job) ({peak} and {FLOPS_PER_RANK})"),
    ]
