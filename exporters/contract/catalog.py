"""One source of truth for the names other parts of Trainwatch rely on.

Alert rules, dashboards, Ansible defaults and tests all refer to these names; a test checks
that every metric used in a rule or a panel is one that an exporter really emits. The metric
table (`METRICS`, below) defines each metric once, with its type, HELP text, labels, unit and
sources; CONTRIBUTING.md says how to add one. Keep this
module dependency-free so any part (including the training client) can import it cheaply.
See docs/contracts.md for the prose version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

# --- facts shared with Ansible and the docs: defined once in contract.json -------------------
_CONTRACT = json.loads(Path(__file__).with_name("contract.json").read_text())
# Default ports (production). The local inventory and the tests override them.
PORTS: dict[str, int] = dict(_CONTRACT["ports"])
# Token files, relative to the deployment's prefix (Ansible's trainwatch_prefix).
TOKEN_FILES: dict[str, str] = dict(_CONTRACT["token_files"])
# What a job name must look like: it becomes a label value, a path component (log files) and
# part of control-API paths (trainwatch.exporters.contract.identity validates it).
JOB_NAME_PATTERN: str = _CONTRACT["job_name_pattern"]
# The label every Trainwatch alerting rule carries (alert_rules/model.py): how an Alertmanager
# that also routes a site's own alerts tells Trainwatch's apart (the alertmanager role's
# existing mode routes on it), whatever their names.
ALERT_LABEL: dict[str, str] = dict(_CONTRACT["alert_label"])

# --- label names ----------------------------------------------------------------------------
LABEL_JOB = "training_job"
LABEL_RANK = "rank"
LABEL_NODE = "node"
LABEL_GPU = "gpu"
LABEL_UUID = "uuid"
LABEL_GPU_NAME = "name"
TRAINING_LABELS = (LABEL_JOB, LABEL_RANK, LABEL_NODE)
# The fast alerts an exporter posts to Alertmanager the moment it sees a hard event
# (trainwatch.exporters.node.fast_alerts): marked with LABEL_FAST="true", which routes them to
# remediation only and tells remediation which alert of a fault came first; LABEL_EVENT is the
# event's time (UNIX milliseconds), so each event is an alert of its own.
LABEL_FAST = "trainwatch_fast"
LABEL_EVENT = "trainwatch_event"
# The launch (incarnation) a rank belongs to: the id its ranks share (the wire's incarnation),
# on the stall evidence, so the rules take a job's newest launch only (an old node keeps
# serving an earlier launch's ranks after the job moved; alert_rules/training.py SUPERSEDED).
LABEL_INCARNATION = "incarnation"
GPU_LABELS = (LABEL_GPU, LABEL_UUID, LABEL_GPU_NAME)

# --- environment variables read by the training client ---------------------------------------
ENV_JOB = "TRAINWATCH_JOB"
ENV_EXPORTER_SOCKET = "TRAINWATCH_EXPORTER_SOCKET"
ENV_SYNC_EVERY = "TRAINWATCH_SYNC_EVERY"
# The node's training log directory: where a rank's AsyncEcsHandler writes when no directory is
# given (the training_exporter role's TaskProlog sets it to trainwatch_training_log_dir).
ENV_LOG_DIR = "TRAINWATCH_LOG_DIR"
# Where a stalled rank dumps PyTorch's flight recorder for the diagnostics (docs/training.md).
ENV_DIAGNOSTICS_DIR = "TRAINWATCH_DIAGNOSTICS_DIR"
# Where a rank sends when TRAINWATCH_EXPORTER_SOCKET is unset, and where the training_exporter
# role makes the exporter listen unless an inventory says otherwise: one value for both.
DEFAULT_EXPORTER_SOCKET: str = _CONTRACT["exporter_socket"]


def command_socket(report_socket: str) -> str:
    """The Unix stream socket a rank polls its commands on, beside the datagram socket it
    reports to (`training.sock` -> `training-commands.sock`): the exporter serves both, and
    a rank that knows one knows the other."""
    head, _, name = report_socket.rpartition("/")
    stem, dot, suffix = name.rpartition(".")
    name = f"{stem}-commands.{suffix}" if dot and stem else f"{name}-commands"
    return f"{head}/{name}" if head or report_socket.startswith("/") else name


# A rank whose datagrams (one at least every second, exporters/rank/shipper.py
# HEARTBEAT_SECONDS, even while it is blocked in a collective) stopped this long ago has left
# the job: killed, its node gone, or the job scaled down without it. The training exporter no
# longer counts it as a member a command waits for (its series stay until the job expires:
# the stall and vanished alerts read them), and the training_command remediation action
# sends only to exporters with a job heartbeat this recent. The same bound as
# TrainingStalled's heartbeat_stale_seconds in production.
RANK_DEPARTED_AFTER_SECONDS = 30.0

# === The metric table ===================================================================

class Metric(NamedTuple):
    """One row of the metric table (the shape of dcgm-exporter's default-counters.csv)."""

    name: str  # the exposed sample name (counters end in _total)
    type: str  # gauge | counter | histogram
    help: str  # the HELP line, written for the person reading a scrape
    labels: tuple[str, ...]  # every label the exporter puts on it, in order
    unit: str  # base unit: bytes, seconds, watts, celsius, hertz, joules, ratio; "" for counts
    exporter: str  # gpu | training | logscan | remediation
    source: str = ""  # where the value comes from (the NVML call, for GPU metrics)
    dcgm: tuple[str, ...] = ()  # dcgm-exporter fields with the same meaning (maybe other units)
    # The NVML device call the row is read with. The fake NVML answers it with `simulated`
    # (NVML's units and shape; a mapping becomes an object with those attributes) unless a
    # scenario's gpus[i].nvml gives the call another value, or the fake has code for it.
    nvml: str = ""
    simulated: Any = None
    # NVML's value * scale = the row's base unit. With `nvml` the row is a plain getter: the
    # reader calls `nvml(handle)`, multiplies by `scale` and emits it, with no code of its own;
    # with `gpm` the GPM reader does the same for that GPM metric. Without either, code in
    # exporters/node/gpu/ reads it.
    scale: float | None = None
    # The NVML GPM metric the row is read from: the name after `NVML_GPM_METRIC_` (the fake
    # NVML's scenarios use the same names; exporters/node/gpu/gpm.py).
    gpm: str = ""
    # dcgm-exporter's value of the `dcgm` fields * dcgm_scale = the row's base unit (MiB,
    # percent, mJ, MHz there); alert_rules/gpu_source.py writes the conversion from it.
    dcgm_scale: float = 1.0
    # Served only while non-zero: an error counter or flag a healthy GPU keeps at 0 and an
    # alert reads every round. Prometheus spends ~10 us of CPU per matched series and PromQL read
    # whatever the expression drops afterwards, so 8,192 GPUs' zeros cost rule time every
    # 15 s for nothing (docs/gpu_exporter.md, "Sparse error series").
    sparse: bool = False
    # The rank datagram's field that carries this per-rank value (exporters/contract/wire.py
    # decodes it, the training exporter's store keeps it, its collector serves it under this
    # row): a new per-rank counter is this row plus the field of the rank-side counters
    # (exporters/rank/counters.py RankCounters) that counts it.
    wire: str = ""
    wire_type: type = float  # int: a count the datagram carries as a JSON integer
    # Served only while finite: a NaN or infinite value leaves the series absent until a
    # finite one comes. The spike alerts average these over their baseline window, and one
    # NaN sample makes `avg_over_time` NaN, so every comparison with the baseline false, for
    # as long as it stays in the window (30 minutes in production); a gap leaves the mean
    # over the finite samples. The event itself is a counter's (TRAINING_NONFINITE_LOSS).
    finite: bool = False


METRICS: dict[str, Metric] = {}
GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"


def _define(exporter: str, name: str, kind: str, help_text: str, labels: tuple[str, ...],
            unit: str = "", **extra: Any) -> str:
    """Add one row; a name defined twice or a counter without `_total` is a bug here."""
    if name in METRICS:
        raise ValueError(f"metric {name} is defined twice")
    if (kind == COUNTER) != name.endswith("_total"):
        raise ValueError(f"metric {name}: counters, and only counters, end in _total")
    METRICS[name] = Metric(name, kind, help_text, labels, unit, exporter, **extra)
    return name


def metrics_of(exporter: str) -> tuple[Metric, ...]:
    """The exporter's rows in table order (the GPU exporter serves its families in it)."""
    return tuple(m for m in METRICS.values() if m.exporter == exporter)


def help_of(name: str) -> str:
    return METRICS[name].help


# --- training exporter (labels: training_job, rank, node) --------------------------------------
def _training(name: str, kind: str, help_text: str, extra: tuple[str, ...] = (),
              unit: str = "", **more: Any) -> str:
    return _define("training", name, kind, help_text, (*TRAINING_LABELS, *extra), unit, **more)


TRAINING_STEP = _training("training_step", GAUGE, "Last step the rank reported.")
TRAINING_LOSS = _training("training_loss", GAUGE,
                          "Loss at the last reported step; absent while it is NaN or infinite "
                          "(training_nonfinite_loss_total counts those).", finite=True)
TRAINING_LEARNING_RATE = _training("training_learning_rate", GAUGE,
                                   "Learning rate at the last reported step.")
TRAINING_GRAD_NORM = _training("training_grad_norm", GAUGE,
                               "Gradient norm at the last reported step; absent while it is "
                               "NaN or infinite.", finite=True)
TRAINING_LAST_STEP_TIMESTAMP = _training("training_last_step_timestamp_seconds", GAUGE,
                                         "Unix time of the last reported step.", unit="seconds")
TRAINING_WORLD_SIZE = _training("training_world_size", GAUGE,
                                "World size the rank's launcher reported.")
TRAINING_RESTARTS = _training("training_restarts", GAUGE,
                              "Restart count the rank's launcher reported.")
TRAINING_DATA_WAIT = _training("training_data_wait_seconds", GAUGE,
                               "Seconds the last step waited for data.", unit="seconds")
TRAINING_CUDA_MEM_ALLOCATED = _training("training_cuda_memory_allocated_bytes", GAUGE,
                                        "CUDA memory allocated by the rank.", unit="bytes")
TRAINING_CUDA_MEM_RESERVED = _training("training_cuda_memory_reserved_bytes", GAUGE,
                                       "CUDA memory reserved by the rank's allocator.",
                                       unit="bytes")
# MFU (exporters/rank/flops.py): the rank's peak FLOP/s for its dtype (absent when
# unknown, e.g. on CPU), and below the model FLOPs its samples/tokens needed
TRAINING_PEAK_FLOPS = _training("training_peak_flops_per_second", GAUGE,
                                "Peak FLOP/s of the rank's GPU for its dtype (MFU's "
                                "denominator).", unit="flops_per_second",
                                wire="peak_flops", sparse=True)
# Liveness and hang location (issue 13; docs/training.md "Hangs").
TRAINING_HEARTBEAT_TIMESTAMP = _training("training_heartbeat_timestamp_seconds", GAUGE,
                                         "Unix time the rank's last datagram arrived.",
                                         unit="seconds")
TRAINING_FINISHED = _training("training_finished", GAUGE,
                              "1 once the rank closed its monitor (a clean end).")
TRAINING_EXITED = _training("training_exited", GAUGE,
                            "1 once the rank's monitor ended without a clean finish (an "
                            "exception or SIGTERM, often after a peer died); absent "
                            "otherwise.")
TRAINING_IN_COLLECTIVE = _training("training_in_collective", GAUGE,
                                   "1 while the rank is inside a collective.")
TRAINING_COLLECTIVE_START = _training("training_collective_start_timestamp_seconds", GAUGE,
                                      "Unix time the rank entered the collective it is inside.",
                                      unit="seconds")
TRAINING_COLLECTIVE_SEQ = _training(
    "training_collective_sequence", GAUGE,
    "Sequence number of the last collective the rank entered on the job's group.")
TRAINING_COLLECTIVE_ID = _training(
    "training_collective_id", GAUGE,
    "Number naming the collective the rank is inside, on any process group (equal on every "
    "rank inside the same one: group, sequence, operation); 0 outside any.")
# Per job and node, one series per exporter and job instead of one per rank: what the alert
# rules read every round to tell whether a job steps and lives (a read costs Prometheus about
# 10 us per series; docs/training.md "Series the rules read").
TRAINING_NODE_LABELS = (LABEL_JOB, LABEL_NODE)
TRAINING_NODE_LAST_STEP_TIMESTAMP = _define(
    "training", "training_node_last_step_timestamp_seconds", GAUGE,
    "Unix time of the newest step any of the job's ranks on this node reported.",
    TRAINING_NODE_LABELS, "seconds")
TRAINING_NODE_HEARTBEAT_TIMESTAMP = _define(
    "training", "training_node_heartbeat_timestamp_seconds", GAUGE,
    "Unix time the newest datagram from any of the job's ranks on this node arrived.",
    TRAINING_NODE_LABELS, "seconds")
# The job's ranks on this node added up (exporters/node/training/store.py NodeRollup: counters that
# only grow, even when a rank restarts from 0): the job-wide rates, MFU and median step time
# the rules record read these, one series per node instead of one per rank.
TRAINING_NODE_SAMPLES = _define("training", "training_node_samples_total", COUNTER,
                                "Samples processed by the job's ranks on this node.",
                                TRAINING_NODE_LABELS)
TRAINING_NODE_TOKENS = _define("training", "training_node_tokens_total", COUNTER,
                               "Tokens processed by the job's ranks on this node.",
                               TRAINING_NODE_LABELS)
TRAINING_NODE_MODEL_FLOPS = _define(
    "training", "training_node_model_flops_total", COUNTER,
    "Model FLOPs of the samples or tokens the job's ranks on this node that know their "
    "GPU's peak processed (the job's MFU numerator).",
    TRAINING_NODE_LABELS, "flops")
TRAINING_NODE_PEAK_FLOPS = _define(
    "training", "training_node_peak_flops_per_second", GAUGE,
    "Sum of the peak FLOP/s of the job's ranks on this node that report model FLOPs and a "
    "peak (the job's MFU denominator).", TRAINING_NODE_LABELS, "flops_per_second")
TRAINING_NODE_STEP_DURATION = _define(
    "training", "training_node_step_duration_seconds", HISTOGRAM,
    "Wall time of one training step, every step of the job's ranks on this node.",
    TRAINING_NODE_LABELS, "seconds")
# Hang location, exposed only while every rank of the job on this node has gone without a step
# for a while (exporters/node/training/collector.py, stall_evidence_after): absent in a job that
# steps, so the stall rules' per-rank read costs nothing until a job may be stalled.
TRAINING_STALL_EVIDENCE = _training(
    "training_stall_evidence", GAUGE,
    "While the job's ranks on this node make no progress: the rank's collective sequence "
    "(signal=seq), last step (signal=step), heartbeat Unix time (signal=heartbeat), the "
    "collective it is inside (signal=collective, as training_collective_id) or whether it "
    "ended without a clean finish (signal=exited, 0 or 1); incarnation is the rank's launch.",
    extra=("signal", LABEL_INCARNATION))
STALL_EVIDENCE_SIGNALS = ("seq", "step", "heartbeat", "collective", "exited")
TRAINING_SAMPLES = _training("training_samples_total", COUNTER, "Samples processed.",
                             wire="samples_total")
TRAINING_TOKENS = _training("training_tokens_total", COUNTER, "Tokens processed.",
                            wire="tokens_total")
# Exposed from the rank's first non-finite loss (absent before): the alert reads it every
# round, and the rules' `x > 0 unless x offset w` catches a counter born non-zero.
TRAINING_NONFINITE_LOSS = _training("training_nonfinite_loss_total", COUNTER,
                                    "Steps whose loss was NaN or infinite (absent until the "
                                    "first).", wire="nonfinite", wire_type=int,
                                    sparse=True)
TRAINING_DROPPED_SAMPLES = _training("training_dropped_samples_total", COUNTER,
                                     "Step reports the rank could not deliver.",
                                     wire="dropped", wire_type=int)
TRAINING_ROLLBACKS = _training("training_rollbacks_total", COUNTER,
                               "Checkpoint rollbacks the rank applied.", wire="rollbacks",
                               wire_type=int)
TRAINING_MODEL_FLOPS = _training("training_model_flops_total", COUNTER,
                                 "Model FLOPs (forward + backward) of the samples or tokens "
                                 "processed; rate() = achieved FLOP/s.", unit="flops",
                                 wire="flops_total", sparse=True)
TRAINING_CHECKPOINT_FAILURES = _training(
    "training_checkpoint_failures_total", COUNTER,
    "Checkpoint saves that failed on this rank (not eligible for rollback).",
    wire="checkpoint_failures", wire_type=int)
TRAINING_COMMANDS_APPLIED = _training("training_commands_applied_total", COUNTER,
                                      "Control commands the rank applied, by type.",
                                      extra=("command",))
TRAINING_STEP_DURATION = _training("training_step_duration_seconds", HISTOGRAM,
                                   "Wall time of one training step.", unit="seconds")
# Stragglers (issue 28): each rank's own compute time per step (step time minus waiting in
# collectives, exporters/rank/collectives.py OwnCompute), per rank and, for the rules, per
# job and node: the median of the ranks here, the slowest rank here and how many ranks
# measured (one series each per node, instead of one per rank).
TRAINING_COMPUTE = _training(
    "training_compute_seconds", GAUGE,
    "Mean own compute time per step over the last minute: step time minus time waiting in "
    "collectives (equal step times in synchronous training hide a slow rank; this does "
    "not).", unit="seconds")
TRAINING_NODE_COMPUTE_MEDIAN = _define(
    "training", "training_node_compute_median_seconds", GAUGE,
    "Median over the job's ranks on this node of their own compute time per step.",
    TRAINING_NODE_LABELS, "seconds")
TRAINING_NODE_COMPUTE_SLOWEST = _define(
    "training", "training_node_compute_slowest_seconds", GAUGE,
    "Own compute time per step of the slowest of the job's ranks on this node (label rank).",
    (*TRAINING_NODE_LABELS, LABEL_RANK), "seconds")
TRAINING_NODE_COMPUTE_RANKS = _define(
    "training", "training_node_compute_ranks", GAUGE,
    "How many of the job's ranks on this node have an own compute time.",
    TRAINING_NODE_LABELS)
# Goodput (exporters/contract/goodput.py, docs/goodput.md): every second of the job's ranks on
# this node, summed over them (rank-seconds, like CPU seconds over cores), as counters that
# survive restarts of the job and of the exporter. kind partitions wall; discarded is a part
# of productive, so goodput = productive - discarded and ETTR = goodput / wall.
TRAINING_NODE_WALL = _define(
    "training", "training_node_wall_seconds_total", COUNTER,
    "Seconds of the job's life on this node, summed over its ranks there (first start to "
    "finish, across incarnations).", TRAINING_NODE_LABELS, "seconds")
TRAINING_NODE_TIME = _define(
    "training", "training_node_time_seconds_total", COUNTER,
    "The job's seconds on this node by kind: productive or a badput cause (they add up to "
    "wall).", (*TRAINING_NODE_LABELS, "kind"), "seconds")
TRAINING_NODE_DISCARDED = _define(
    "training", "training_node_discarded_seconds_total", COUNTER,
    "Productive seconds of steps later thrown away, by cause (rollback, restart).",
    (*TRAINING_NODE_LABELS, "cause"), "seconds")
TRAINING_NODE_NEGATIVE_INTERVALS = _define(
    "training", "training_node_negative_intervals_total", COUNTER,
    "Intervals of the job's accounting that ended before they began (two clocks or late "
    "datagrams): counted here, booked nowhere.", TRAINING_NODE_LABELS)
# Per rank, only the causes that point at one rank (its loader, its checkpoint storage): two
# series per rank that no rule reads; the rules read the per-node kinds above.
TRAINING_RANK_BADPUT = _training(
    "training_badput_seconds_total", COUNTER,
    "Seconds this rank's process spent waiting for data (kind=data_wait) or blocked in "
    "checkpoint saves (kind=checkpoint_save).", extra=("kind",), unit="seconds")
TRAINING_EXPORTER_PREFIX = "trainwatch_training_exporter_"
TRAINING_EXPORTER_JOBS = _define("training", TRAINING_EXPORTER_PREFIX + "jobs", GAUGE,
                                 "Jobs currently reporting to this exporter.", ())
TRAINING_EXPORTER_DATAGRAMS = _define("training", TRAINING_EXPORTER_PREFIX + "datagrams_total",
                                      COUNTER, "Datagrams received from ranks.", ())
TRAINING_EXPORTER_MALFORMED = _define(
    "training", TRAINING_EXPORTER_PREFIX + "malformed_datagrams_total", COUNTER,
    "Datagrams ignored because they broke the protocol.", ())
TRAINING_EXPORTER_FAST_ALERTS = _define(
    "training", TRAINING_EXPORTER_PREFIX + "fast_alerts_total", COUNTER,
    "Fast TrainingJobVanished alerts for a killed rank posted straight to Alertmanager "
    "(exporters/node/fast_alerts.py), by outcome: sent (an Alertmanager accepted it) or "
    "dropped (queue full, or an Alertmanager did not answer; the rule's alert still follows).",
    ("outcome",))
# TRAINING_EXPORTER_FAST_ALERTS's outcome label values (one place: "dropped" is also a
# per-rank wire name, which only the catalog and the counters spell)
FAST_ALERT_SENT, FAST_ALERT_DROPPED = "sent", "dropped"
TRAINING_EXPORTER_REFUSED = _define(
    "training", TRAINING_EXPORTER_PREFIX + "refused_total", COUNTER,
    "Calls refused because the caller spoke for a job that is not its own: datagrams "
    "(channel=report) and command polls (channel=commands) from a process of another "
    "identity than the job's, control API calls without the remediation credential "
    "(channel=control_api).", ("channel",))
# The per-rank values the datagram carries as plain numbers, one field per row (`wire`): the
# datagram's decoder, the store's rank state and the collector's mapping all iterate these.
RANK_WIRE: tuple[Metric, ...] = tuple(row for row in metrics_of("training") if row.wire)

# --- log scanner --------------------------------------------------------------------------------
LOGSCAN_PREFIX = "trainwatch_logscan_"
LOG_EVENT_KINDS = (
    "cuda_oom",
    "nccl_timeout",
    "nccl_error",
    "elastic_child_failed",
    "rendezvous_timeout",
    "nonfinite_loss",
    "xid",
)
LOG_EVENTS = _define("logscan", "training_log_events_total", COUNTER,
                     "Failure events found in training logs, by class.",
                     (LABEL_JOB, LABEL_RANK, "kind"))  # kind: one of LOG_EVENT_KINDS
LOG_XID_EVENTS = _define("logscan", "training_log_xid_events_total", COUNTER,
                         "NVIDIA driver Xid events in the kernel log.", ("xid", "pci_bus_id"))
LOGSCAN_LINES = _define("logscan", LOGSCAN_PREFIX + "lines_total", COUNTER,
                        "Log lines scanned.", ())
LOGSCAN_FILES_FOLLOWED = _define("logscan", LOGSCAN_PREFIX + "files_followed", GAUGE,
                                 "Log files being followed.", ())
LOGSCAN_READ_ERRORS = _define("logscan", LOGSCAN_PREFIX + "read_errors_total", COUNTER,
                              "Errors opening or reading log sources.", ())

# --- GPU exporter (per-GPU labels: gpu, uuid, name) -------------------------------------------
# Rows are served in this order. Base units: bytes, watts, celsius, hertz, joules, ratio 0-1.
GPU_PREFIX = "trainwatch_gpu_"
GPU_EXPORTER_PREFIX = "trainwatch_gpu_exporter_"


def _gpu(suffix: str, kind: str, help_text: str, extra: tuple[str, ...] = (), unit: str = "",
         **more: Any) -> str:
    if more.get("sparse"):  # the docs' source column says so, from the flag alone
        more["source"] = f"{more.get('source', '')}; {SPARSE_NOTE}"
    return _define("gpu", GPU_PREFIX + suffix, kind, help_text, (*GPU_LABELS, *extra), unit,
                   **more)


SPARSE_NOTE = "sparse: served only while non-zero (absent while 0)"
# Unit scales (a value in that unit * scale = the base unit), for NVML's, GPM's and DCGM's
# units: `scale` and `dcgm_scale` of the rows below.
PERCENT = 0.01
MIB = 1048576.0
MILLI = 1e-3
MEGA = 1e6


GPU_UP = _gpu("up", GAUGE,
              "1 if the GPU answered NVML in the last cycle, 0 if it is lost or unreachable.",
              source="0 when the GPU is lost or its handle fails")
# GpuLost reads this, not every GPU's `up`, every round (docs/gpu_exporter.md "Sparse error
# series"): present only while the GPU is lost.
GPU_LOST = _gpu("lost", GAUGE, "1 while the GPU is lost or unreachable (absent otherwise).",
                source="1 when `up` is 0", sparse=True)
GPU_INFO = _gpu("info", GAUGE, "GPU identity; value 1.", ("pci_bus_id",),
                source="`nvmlDeviceGetPciInfo` (matches the log scanner's `pci_bus_id`)")
GPU_XID_ERRORS = _gpu("xid_errors_total", COUNTER,
                      "XID errors reported by the NVML event API since the exporter started.",
                      ("xid",), source="NVML event API, own thread",
                      dcgm=("DCGM_FI_DEV_XID_ERRORS",), sparse=True)
GPU_UTILIZATION = _gpu("utilization_ratio", GAUGE,
                       "Fraction of time a kernel was running on the GPU (0-1).", unit="ratio",
                       source="`nvmlDeviceGetUtilizationRates`", dcgm=("DCGM_FI_DEV_GPU_UTIL",),
                       dcgm_scale=PERCENT)
GPU_MEMORY_UTILIZATION = _gpu(
    "memory_utilization_ratio", GAUGE,
    "Fraction of time device memory was being read or written (0-1).", unit="ratio",
    source="`nvmlDeviceGetUtilizationRates`", dcgm=("DCGM_FI_DEV_MEM_COPY_UTIL",),
    dcgm_scale=PERCENT)
GPU_MEMORY_USED = _gpu("memory_used_bytes", GAUGE,
                       "Device memory used, bytes (as nvidia-smi: without the driver's "
                       "reservation where the driver has NVML's v2 memory info).", unit="bytes",
                       source="`nvmlDeviceGetMemoryInfo` v2 (v1 on drivers before 510)",
                       dcgm=("DCGM_FI_DEV_FB_USED",), dcgm_scale=MIB)
GPU_MEMORY_FREE = _gpu("memory_free_bytes", GAUGE, "Device memory free, bytes.", unit="bytes",
                       source="`nvmlDeviceGetMemoryInfo`", dcgm=("DCGM_FI_DEV_FB_FREE",),
                       dcgm_scale=MIB)
GPU_MEMORY_TOTAL = _gpu("memory_total_bytes", GAUGE, "Device memory total, bytes.",
                        unit="bytes", source="`nvmlDeviceGetMemoryInfo`")
# Driver/firmware reservation (NVML v2 memory info, driver >= 510; nvidia-smi's "Reserved").
# Absent on v1-only drivers, whose "used" includes the reservation.
GPU_MEMORY_RESERVED = _gpu("memory_reserved_bytes", GAUGE,
                           "Device memory reserved by the driver and firmware, bytes (v2 "
                           "memory info only).", unit="bytes",
                           source="`nvmlDeviceGetMemoryInfo` v2 only",
                           dcgm=("DCGM_FI_DEV_FB_RESERVED",), dcgm_scale=MIB)
GPU_TEMPERATURE = _gpu("temperature_celsius", GAUGE, "GPU core temperature, degrees Celsius.",
                       unit="celsius", source="`nvmlDeviceGetTemperature(GPU)`",
                       dcgm=("DCGM_FI_DEV_GPU_TEMP",))
GPU_POWER_USAGE = _gpu("power_usage_watts", GAUGE, "Power draw, watts.", unit="watts",
                       source="`nvmlDeviceGetPowerUsage`", dcgm=("DCGM_FI_DEV_POWER_USAGE",))
GPU_POWER_LIMIT = _gpu("power_limit_watts", GAUGE, "Enforced power limit, watts.",
                       unit="watts", source="`nvmlDeviceGetEnforcedPowerLimit`")
GPU_POWER_LIMIT_MIN = _gpu("power_limit_min_watts", GAUGE,
                           "Lowest settable power limit, watts.", unit="watts",
                           source="`nvmlDeviceGetPowerManagementLimitConstraints`")
GPU_POWER_LIMIT_MAX = _gpu("power_limit_max_watts", GAUGE,
                           "Highest settable power limit, watts.", unit="watts",
                           source="`nvmlDeviceGetPowerManagementLimitConstraints`")
GPU_POWER_LIMIT_DEFAULT = _gpu("power_limit_default_watts", GAUGE,
                               "Default power limit, watts.", unit="watts",
                               source="`nvmlDeviceGetPowerManagementDefaultLimit`")
GPU_ENERGY = _gpu("energy_joules_total", COUNTER,
                  "Energy consumed since the driver was loaded, joules.", unit="joules",
                  source="`nvmlDeviceGetTotalEnergyConsumption`",
                  dcgm=("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",), dcgm_scale=MILLI)
GPU_SM_CLOCK = _gpu("sm_clock_hertz", GAUGE, "SM clock, hertz.", unit="hertz",
                    source="`nvmlDeviceGetClockInfo(SM)`", dcgm=("DCGM_FI_DEV_SM_CLOCK",),
                    dcgm_scale=MEGA)
GPU_MEMORY_CLOCK = _gpu("memory_clock_hertz", GAUGE, "Memory clock, hertz.", unit="hertz",
                        source="`nvmlDeviceGetClockInfo(MEM)`", dcgm=("DCGM_FI_DEV_MEM_CLOCK",),
                        dcgm_scale=MEGA)
GPU_CLOCK_EVENT_REASON = _gpu(
    "clock_event_reason_active", GAUGE, "1 if this clock event (throttle) reason is active.",
    ("reason",), source="`nvmlDeviceGetCurrentClocksEventReasons` (drivers before 535: "
    "`...ThrottleReasons`); `reason`: exporters/contract/catalog.py CLOCK_EVENT_REASONS",
    dcgm=("DCGM_FI_DEV_CLOCKS_EVENT_REASONS",), sparse=True)
# The `reason` label's values, each with its bit in NVML's clock event reasons bitmask
# (nvmlClocksEventReason*; DCGM_FI_DEV_CLOCKS_EVENT_REASONS carries the same bitmask).
CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)
GPU_ECC_ERRORS = _gpu("ecc_errors_total", COUNTER,
                      "ECC errors (volatile: since driver load; aggregate: lifetime).",
                      ("error_type", "counter"),
                      source="`nvmlDeviceGetTotalEccErrors`; `error_type` corrected|uncorrected, "
                      "`counter` volatile|aggregate", dcgm=("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",),
                      sparse=True)
GPU_REMAPPED_ROWS = _gpu("remapped_rows", GAUGE, "Memory rows remapped, by cause.", ("cause",),
                         source="`nvmlDeviceGetRemappedRows`; `cause` correctable|uncorrectable",
                         dcgm=("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                               "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"))
GPU_ROW_REMAP_PENDING = _gpu("row_remap_pending", GAUGE,
                             "1 if a row remap is pending (needs a GPU reset).",
                             source="`nvmlDeviceGetRemappedRows`")
GPU_ROW_REMAP_FAILURE = _gpu("row_remap_failure", GAUGE,
                             "1 if a row remap failed (the GPU should be replaced).",
                             source="`nvmlDeviceGetRemappedRows`",
                             dcgm=("DCGM_FI_DEV_ROW_REMAP_FAILURE",), sparse=True)
GPU_PCIE_LINK_GENERATION = _gpu("pcie_link_generation", GAUGE, "Current PCIe link generation.",
                                source="`nvmlDeviceGetCurrPcieLinkGeneration`",
                                nvml="nvmlDeviceGetCurrPcieLinkGeneration", simulated=5, scale=1.0)
GPU_PCIE_LINK_WIDTH = _gpu("pcie_link_width", GAUGE, "Current PCIe link width (lanes).",
                           source="`nvmlDeviceGetCurrPcieLinkWidth`",
                           nvml="nvmlDeviceGetCurrPcieLinkWidth", simulated=16, scale=1.0)
GPU_PCIE_REPLAYS = _gpu("pcie_replays_total", COUNTER, "PCIe replay counter.",
                        source="`nvmlDeviceGetPcieReplayCounter`",
                        dcgm=("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",),
                        nvml="nvmlDeviceGetPcieReplayCounter", simulated=0, scale=1.0)
GPU_NVLINK_UP = _gpu("nvlink_up", GAUGE, "1 if the NVLink link is active.", ("link",),
                     source="`nvmlDeviceGetNvLinkState` (links 0.. until NVML refuses one)")
GPU_NVLINK_ERRORS = _gpu("nvlink_errors_total", COUNTER, "NVLink data-link error counters.",
                         ("link", "counter"), source="`nvmlDeviceGetNvLinkErrorCounter`; "
                         "`counter` replay|recovery|crc_flit|crc_data")
GPU_PROCESSES = _gpu("processes", GAUGE, "Compute processes on the GPU.",
                     source="`nvmlDeviceGetComputeRunningProcesses`")
GPU_PROCESS_MEMORY = _gpu("process_memory_used_bytes", GAUGE,
                          "GPU memory used by compute processes, by training job and rank "
                          "(empty labels: not attributable).", (LABEL_JOB, LABEL_RANK),
                          unit="bytes", source="`nvmlDeviceGetComputeRunningProcesses`, summed "
                          "per (job, rank)")
GPU_MIG_ENABLED = _gpu("mig_enabled", GAUGE, "1 if MIG mode is enabled.",
                       source="`nvmlDeviceGetMigMode`")
GPU_MIG_MEMORY_USED = _gpu("mig_memory_used_bytes", GAUGE, "Memory used on a MIG device, bytes.",
                           ("mig_index", "mig_uuid"), unit="bytes",
                           source="MIG device handles, `nvmlDeviceGetMemoryInfo`")
GPU_MIG_MEMORY_TOTAL = _gpu("mig_memory_total_bytes", GAUGE, "Memory of a MIG device, bytes.",
                            ("mig_index", "mig_uuid"), unit="bytes",
                            source="MIG device handles, `nvmlDeviceGetMemoryInfo`")
# Profiling metrics through NVML GPM (exporters/node/gpu/gpm.py maps each to its GPM metric),
# averaged over one collection interval; absent where GPM is not supported.
GPU_GPM_SUPPORTED = _gpu("gpm_supported", GAUGE,
                         "1 if the profiling metrics (NVML GPM) are read on this GPU; 0: not "
                         "supported, or MIG mode is enabled.",
                         source="`nvmlGpmQueryDeviceSupport`; 0 also while MIG is enabled")


def _gpm(suffix: str, help_text: str, dcgm: str, gpm: str, unit: str = "ratio") -> str:
    """A GPM row: GPM answers percent (a ratio's row) or MiB/s (a bytes-per-second row); DCGM's
    profiling fields are ratios and bytes/s already."""
    scale = {"ratio": PERCENT, "bytes_per_second": MIB}[unit]
    return _gpu(suffix, GAUGE, help_text, unit=unit, source="NVML GPM (exporters/node/gpu/gpm.py)",
                dcgm=(dcgm,), gpm=gpm, scale=scale)


GPU_GRAPHICS_ENGINE_ACTIVE = _gpm(
    "graphics_engine_active_ratio",
    "Fraction of time the graphics/compute engine was active (0-1), GPM.",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "GRAPHICS_UTIL")
GPU_SM_ACTIVE = _gpm("sm_active_ratio",
                     "Fraction of SMs busy, averaged over the interval (0-1), GPM.",
                     "DCGM_FI_PROF_SM_ACTIVE", "SM_UTIL")
GPU_SM_OCCUPANCY = _gpm("sm_occupancy_ratio",
                        "Resident warps over the theoretical maximum (0-1), GPM.",
                        "DCGM_FI_PROF_SM_OCCUPANCY", "SM_OCCUPANCY")
GPU_TENSOR_ACTIVE = _gpm("tensor_active_ratio",
                         "Fraction of time the SMs ran any tensor-core operation (0-1), GPM.",
                         "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "ANY_TENSOR_UTIL")
GPU_DRAM_ACTIVE = _gpm("dram_active_ratio",
                       "Device memory bandwidth used over the theoretical maximum (0-1), GPM.",
                       "DCGM_FI_PROF_DRAM_ACTIVE", "DRAM_BW_UTIL")
GPU_FP64_ACTIVE = _gpm("fp64_active_ratio",
                       "Fraction of time the SMs ran non-tensor FP64 math (0-1), GPM.",
                       "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "FP64_UTIL")
GPU_FP32_ACTIVE = _gpm("fp32_active_ratio",
                       "Fraction of time the SMs ran non-tensor FP32 math (0-1), GPM.",
                       "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "FP32_UTIL")
GPU_FP16_ACTIVE = _gpm("fp16_active_ratio",
                       "Fraction of time the SMs ran non-tensor FP16 math (0-1), GPM.",
                       "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "FP16_UTIL")
GPU_PCIE_TX_RATE = _gpm("pcie_tx_bytes_per_second",
                        "PCIe traffic from this GPU, bytes per second, GPM.",
                        "DCGM_FI_PROF_PCIE_TX_BYTES", "PCIE_TX_PER_SEC", unit="bytes_per_second")
GPU_PCIE_RX_RATE = _gpm("pcie_rx_bytes_per_second",
                        "PCIe traffic to this GPU, bytes per second, GPM.",
                        "DCGM_FI_PROF_PCIE_RX_BYTES", "PCIE_RX_PER_SEC", unit="bytes_per_second")
GPU_NVLINK_TX_RATE = _gpm("nvlink_tx_bytes_per_second",
                          "NVLink traffic sent over all links, bytes per second, GPM.",
                          "DCGM_FI_PROF_NVLINK_TX_BYTES", "NVLINK_TOTAL_TX_PER_SEC",
                          unit="bytes_per_second")
GPU_NVLINK_RX_RATE = _gpm("nvlink_rx_bytes_per_second",
                          "NVLink traffic received over all links, bytes per second, GPM.",
                          "DCGM_FI_PROF_NVLINK_RX_BYTES", "NVLINK_TOTAL_RX_PER_SEC",
                          unit="bytes_per_second")


# Exporter-wide series (no GPU labels).
def _gpu_exporter(name: str, kind: str, help_text: str, labels: tuple[str, ...] = (),
                  unit: str = "", source: str = "") -> str:
    return _define("gpu", name, kind, help_text, labels, unit, source=source)


GPU_EXPORTER_SIMULATED = _gpu_exporter(
    GPU_EXPORTER_PREFIX + "simulated", GAUGE,
    "1 if the exporter serves a simulated (fake) NVML, 0 on real hardware.")
GPU_EXPORTER_NVML_UP = _gpu_exporter(GPU_EXPORTER_PREFIX + "nvml_up", GAUGE,
                                     "1 if NVML is initialised and answering.")
GPU_EXPORTER_COLLECTION_DURATION = _gpu_exporter(
    GPU_EXPORTER_PREFIX + "collection_duration_seconds", GAUGE,
    "Duration of the last completed collection cycle, seconds.", unit="seconds")
GPU_EXPORTER_LAST_SUCCESS = _gpu_exporter(
    GPU_EXPORTER_PREFIX + "last_success_timestamp_seconds", GAUGE,
    "Unix time of the last cycle that read NVML successfully.", unit="seconds")
GPU_EXPORTER_DATA_AGE = _gpu_exporter(GPU_EXPORTER_PREFIX + "data_age_seconds", GAUGE,
                                      "Age of the data served, seconds.", unit="seconds")
GPU_EXPORTER_STALE = _gpu_exporter(
    GPU_EXPORTER_PREFIX + "stale", GAUGE,
    "1 if the data served is stale (a cycle overran its deadline or none ran).")
GPU_EXPORTER_COLLECTIONS = _gpu_exporter(
    GPU_EXPORTER_PREFIX + "collections_total", COUNTER,
    "Collection cycles by result (success, overrun, nvml_down).", ("result",))
GPU_EXPORTER_ERRORS = _gpu_exporter(
    GPU_EXPORTER_PREFIX + "errors_total", COUNTER,
    "NVML call errors by call and error (NotSupported is not an error).", ("call", "error"))
GPU_EXPORTER_XID_WATCH_UP = _gpu_exporter(
    GPU_EXPORTER_PREFIX + "xid_watch_up", GAUGE,
    "1 if the XID event watch is running on at least one GPU.")
GPU_DRIVER_INFO = _gpu_exporter(
    GPU_PREFIX + "driver_info", GAUGE, "NVIDIA driver and CUDA driver versions; value 1.",
    ("driver_version", "cuda_version"),
    source="`nvmlSystemGetDriverVersion`, `nvmlSystemGetCudaDriverVersion`")
GPU_EXPORTER_GPM_DURATION = _gpu_exporter(
    GPU_EXPORTER_PREFIX + "gpm_duration_seconds", GAUGE,
    "Time the last collection cycle spent reading NVML GPM, seconds.", unit="seconds")

# --- remediation service ------------------------------------------------------------------------
REMEDIATION_PREFIX = "trainwatch_remediation_"


def _remediation(suffix: str, kind: str, help_text: str, labels: tuple[str, ...] = (),
                 unit: str = "") -> str:
    return _define("remediation", REMEDIATION_PREFIX + suffix, kind, help_text, labels, unit)


REMEDIATION_DECISIONS = _remediation(
    "decisions_total", COUNTER, "Audit records by decision (acted, refused, cooled_down, ...)",
    ("decision",))
REMEDIATION_ACTIONS = _remediation(
    "actions_total", COUNTER, "Playbook executions that finished, by result (succeeded|failed)",
    ("playbook", "action", "result"))
REMEDIATION_INTENTS = _remediation("intents", GAUGE, "Intents in the store by state", ("state",))
REMEDIATION_OLDEST_PENDING_AGE = _remediation(
    "oldest_pending_age_seconds", GAUGE, "Age of the oldest intent not yet finished",
    unit="seconds")
REMEDIATION_CIRCUIT_BREAKER_OPEN = _remediation(
    "circuit_breaker_open", GAUGE,
    "1 while the circuit breaker of normal-priority playbooks refuses to act (see "
    "circuit_breaker_priority_open)")
REMEDIATION_CIRCUIT_BREAKER_PRIORITY_OPEN = _remediation(
    "circuit_breaker_priority_open", GAUGE,
    "1 while the circuit breaker of this playbook priority refuses to act", ("priority",))
REMEDIATION_ACTIONS_IN_BREAKER_WINDOW = _remediation(
    "actions_in_breaker_window", GAUGE, "Actions granted inside the circuit breaker window")
REMEDIATION_NODE_FAULTS = _remediation(
    "node_faults", GAUGE, "Times the node was quarantined inside the quarantine window (a lemon "
    "node at lemon_faults and above: kept out of service)", ("node",))
REMEDIATION_NODE_FAULT_INTERVAL = _remediation(
    "node_fault_interval_seconds", GAUGE, "Time between the node's last two quarantines inside "
    "the quarantine window", ("node",), unit="seconds")
REMEDIATION_NODE_KEPT_OUT = _remediation(
    "node_kept_out", GAUGE, "1 while the node is a lemon node: quarantined lemon_faults times in "
    "the window, trainwatch-resume-node refuses it", ("node",))
REMEDIATION_WEBHOOK_REQUESTS = _remediation("webhook_requests_total", COUNTER,
                                            "Webhook requests by HTTP status", ("code",))
REMEDIATION_WEBHOOK_DURATION = _remediation("webhook_duration_seconds", HISTOGRAM,
                                            "Time to persist and answer a webhook request",
                                            unit="seconds")
# What self-healing saved (remediation/recovery.py, docs/goodput.md): per playbook, from the
# fault's first evidence (the alert's pending start) to the alert firing, and to the job going
# again (its last step done: for a training command, every rank applied it).
REMEDIATION_TIME_TO_DETECT = _remediation(
    "time_to_detect_seconds", HISTOGRAM,
    "Seconds from a fault's first evidence to its alert firing, for intents that acted",
    ("playbook",), unit="seconds")
REMEDIATION_TIME_TO_RECOVER = _remediation(
    "time_to_recover_seconds", HISTOGRAM,
    "Seconds from a fault's first evidence to the playbook's last step done (the job's next "
    "step runs with the fix)", ("playbook",), unit="seconds")
REMEDIATION_WEBHOOK_ALERTS = _remediation("webhook_alerts_total", COUNTER,
                                          "Alerts received, by outcome at intake", ("outcome",))

# --- other exporters' series the rules and dashboards read (their own exporters define them) ---
NODE_FS_AVAIL = "node_filesystem_avail_bytes"
NODE_FS_SIZE = "node_filesystem_size_bytes"
NODE_FS_READONLY = "node_filesystem_readonly"
NODE_MEM_AVAILABLE = "node_memory_MemAvailable_bytes"
NODE_MEM_TOTAL = "node_memory_MemTotal_bytes"
AM_NOTIFICATIONS = "alertmanager_notifications_total"
AM_NOTIFICATIONS_FAILED = "alertmanager_notifications_failed_total"

# Alert names are the keys of `alerts` in alert_rules/config.yml (alert_rules.config.ALERTS).
