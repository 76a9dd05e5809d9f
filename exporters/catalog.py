"""One source of truth for the names other parts of Trainwatch rely on.

Alert rules, dashboards, Ansible defaults and tests all refer to these names; a test checks
that every metric used in a rule or a panel is one that an exporter really emits. Keep this
module dependency-free so any part (including the training client) can import it cheaply.
See docs/contracts.md for the prose version.
"""

from __future__ import annotations

import json
from pathlib import Path

# --- facts shared with Ansible and the docs: defined once in contract.json -------------------
_CONTRACT = json.loads(Path(__file__).with_name("contract.json").read_text())
# Default ports (production). The local inventory and the tests override them.
PORTS: dict[str, int] = dict(_CONTRACT["ports"])
# Token files, relative to the deployment's prefix (Ansible's trainwatch_prefix).
TOKEN_FILES: dict[str, str] = dict(_CONTRACT["token_files"])
# What a job name must look like: it becomes a label value, a path component (log files) and
# part of control-API paths (exporters.identity validates it).
JOB_NAME_PATTERN: str = _CONTRACT["job_name_pattern"]

# --- label names ----------------------------------------------------------------------------
LABEL_JOB = "training_job"
LABEL_RANK = "rank"
LABEL_NODE = "node"
LABEL_GPU = "gpu"
LABEL_UUID = "uuid"
LABEL_GPU_NAME = "name"
TRAINING_LABELS = (LABEL_JOB, LABEL_RANK, LABEL_NODE)
GPU_LABELS = (LABEL_GPU, LABEL_UUID, LABEL_GPU_NAME)

# --- environment variables read by the training client ---------------------------------------
ENV_JOB = "TRAINWATCH_JOB"
ENV_EXPORTER_SOCKET = "TRAINWATCH_EXPORTER_SOCKET"
ENV_EXPORTER_URL = "TRAINWATCH_EXPORTER_URL"
ENV_CONTROL_TOKEN = "TRAINWATCH_CONTROL_TOKEN"  # noqa: S105 - a variable name, not a secret
ENV_CONTROL_TOKEN_FILE = "TRAINWATCH_CONTROL_TOKEN_FILE"  # noqa: S105
ENV_SYNC_EVERY = "TRAINWATCH_SYNC_EVERY"
# Where a stalled rank dumps PyTorch's flight recorder for the diagnostics (docs/training.md).
ENV_DIAGNOSTICS_DIR = "TRAINWATCH_DIAGNOSTICS_DIR"
DEFAULT_EXPORTER_SOCKET = "/run/trainwatch/training.sock"

# --- training exporter metrics (labels: training_job, rank, node) ----------------------------
TRAINING_STEP = "training_step"
TRAINING_LOSS = "training_loss"
TRAINING_LEARNING_RATE = "training_learning_rate"
TRAINING_GRAD_NORM = "training_grad_norm"
TRAINING_STEP_DURATION = "training_step_duration_seconds"  # histogram
TRAINING_SAMPLES = "training_samples_total"
TRAINING_TOKENS = "training_tokens_total"
# MFU (exporters/training/flops.py): model FLOPs the rank's samples/tokens needed, and the
# rank's peak FLOP/s for its dtype (absent when unknown, e.g. on CPU)
TRAINING_MODEL_FLOPS = "training_model_flops_total"
TRAINING_PEAK_FLOPS = "training_peak_flops_per_second"
TRAINING_LAST_STEP_TIMESTAMP = "training_last_step_timestamp_seconds"
TRAINING_NONFINITE_LOSS = "training_nonfinite_loss_total"
TRAINING_DROPPED_SAMPLES = "training_dropped_samples_total"
TRAINING_WORLD_SIZE = "training_world_size"
TRAINING_RESTARTS = "training_restarts"
TRAINING_COMMANDS_APPLIED = "training_commands_applied_total"  # + label "command"
TRAINING_ROLLBACKS = "training_rollbacks_total"
TRAINING_CHECKPOINT_FAILURES = "training_checkpoint_failures_total"
TRAINING_DATA_WAIT = "training_data_wait_seconds"
TRAINING_CUDA_MEM_ALLOCATED = "training_cuda_memory_allocated_bytes"
TRAINING_CUDA_MEM_RESERVED = "training_cuda_memory_reserved_bytes"
# Liveness and hang location (issue 13; docs/training.md "Hangs").
TRAINING_HEARTBEAT_TIMESTAMP = "training_heartbeat_timestamp_seconds"  # last datagram
TRAINING_FINISHED = "training_finished"  # 1: the rank closed its monitor (clean end)
TRAINING_IN_COLLECTIVE = "training_in_collective"  # 0/1
TRAINING_COLLECTIVE_START = "training_collective_start_timestamp_seconds"  # while inside
TRAINING_COLLECTIVE_SEQ = "training_collective_sequence"  # last collective entered
TRAINING_EXPORTER_PREFIX = "trainwatch_training_exporter_"

# --- log scanner metrics -----------------------------------------------------------------------
LOG_EVENTS = "training_log_events_total"  # labels: training_job, rank, kind
LOG_XID_EVENTS = "training_log_xid_events_total"  # labels: xid, pci_bus_id
LOG_EVENT_KINDS = (
    "cuda_oom",
    "nccl_timeout",
    "nccl_error",
    "elastic_child_failed",
    "rendezvous_timeout",
    "nonfinite_loss",
    "xid",
)
LOGSCAN_PREFIX = "trainwatch_logscan_"

# --- GPU exporter metrics (labels: gpu, uuid, name) ---------------------------------------------
GPU_PREFIX = "trainwatch_gpu_"
GPU_UP = "trainwatch_gpu_up"
GPU_XID_ERRORS = "trainwatch_gpu_xid_errors_total"  # + label "xid"
GPU_EXPORTER_PREFIX = "trainwatch_gpu_exporter_"
GPU_EXPORTER_SIMULATED = "trainwatch_gpu_exporter_simulated"
# Per-GPU series (exporters/gpu/metrics.py groups them; docs/gpu_exporter.md explains them).
# Base units: bytes, watts, celsius, hertz, joules, ratio 0-1. Extra labels noted after '+'.
GPU_INFO = GPU_PREFIX + "info"  # + pci_bus_id; value 1
GPU_DRIVER_INFO = GPU_PREFIX + "driver_info"  # labels driver_version, cuda_version only
GPU_UTILIZATION = GPU_PREFIX + "utilization_ratio"
GPU_MEMORY_UTILIZATION = GPU_PREFIX + "memory_utilization_ratio"
GPU_MEMORY_USED = GPU_PREFIX + "memory_used_bytes"
GPU_MEMORY_FREE = GPU_PREFIX + "memory_free_bytes"
GPU_MEMORY_TOTAL = GPU_PREFIX + "memory_total_bytes"
# Driver/firmware reservation (NVML v2 memory info, driver >= 510; nvidia-smi's "Reserved").
# Absent on v1-only drivers, whose "used" includes the reservation.
GPU_MEMORY_RESERVED = GPU_PREFIX + "memory_reserved_bytes"
GPU_TEMPERATURE = GPU_PREFIX + "temperature_celsius"
GPU_POWER_USAGE = GPU_PREFIX + "power_usage_watts"
GPU_POWER_LIMIT = GPU_PREFIX + "power_limit_watts"  # the enforced limit
GPU_POWER_LIMIT_MIN = GPU_PREFIX + "power_limit_min_watts"
GPU_POWER_LIMIT_MAX = GPU_PREFIX + "power_limit_max_watts"
GPU_POWER_LIMIT_DEFAULT = GPU_PREFIX + "power_limit_default_watts"
GPU_ENERGY = GPU_PREFIX + "energy_joules_total"
GPU_SM_CLOCK = GPU_PREFIX + "sm_clock_hertz"
GPU_MEMORY_CLOCK = GPU_PREFIX + "memory_clock_hertz"
GPU_CLOCK_EVENT_REASON = GPU_PREFIX + "clock_event_reason_active"  # + reason; 0/1
GPU_ECC_ERRORS = GPU_PREFIX + "ecc_errors_total"  # + error_type, counter (volatile|aggregate)
GPU_REMAPPED_ROWS = GPU_PREFIX + "remapped_rows"  # + cause (correctable|uncorrectable)
GPU_ROW_REMAP_PENDING = GPU_PREFIX + "row_remap_pending"
GPU_ROW_REMAP_FAILURE = GPU_PREFIX + "row_remap_failure"
GPU_PCIE_LINK_GENERATION = GPU_PREFIX + "pcie_link_generation"
GPU_PCIE_LINK_WIDTH = GPU_PREFIX + "pcie_link_width"
GPU_PCIE_REPLAYS = GPU_PREFIX + "pcie_replays_total"
GPU_NVLINK_UP = GPU_PREFIX + "nvlink_up"  # + link
GPU_NVLINK_ERRORS = GPU_PREFIX + "nvlink_errors_total"  # + link, counter
GPU_PROCESSES = GPU_PREFIX + "processes"
GPU_PROCESS_MEMORY = GPU_PREFIX + "process_memory_used_bytes"  # + training_job, rank
GPU_MIG_ENABLED = GPU_PREFIX + "mig_enabled"
GPU_MIG_MEMORY_USED = GPU_PREFIX + "mig_memory_used_bytes"  # + mig_index, mig_uuid
GPU_MIG_MEMORY_TOTAL = GPU_PREFIX + "mig_memory_total_bytes"  # + mig_index, mig_uuid
# Profiling metrics through NVML GPM (exporters/gpu/gpm.py), averaged over one collection
# interval; absent where GPM is not supported. DCGM twin after '~'.
GPU_GPM_SUPPORTED = GPU_PREFIX + "gpm_supported"  # 0/1; 0 also while MIG is enabled
GPU_GRAPHICS_ENGINE_ACTIVE = GPU_PREFIX + "graphics_engine_active_ratio"  # ~ GR_ENGINE_ACTIVE
GPU_SM_ACTIVE = GPU_PREFIX + "sm_active_ratio"  # ~ DCGM_FI_PROF_SM_ACTIVE
GPU_SM_OCCUPANCY = GPU_PREFIX + "sm_occupancy_ratio"  # ~ DCGM_FI_PROF_SM_OCCUPANCY
GPU_TENSOR_ACTIVE = GPU_PREFIX + "tensor_active_ratio"  # ~ DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
GPU_DRAM_ACTIVE = GPU_PREFIX + "dram_active_ratio"  # ~ DCGM_FI_PROF_DRAM_ACTIVE
GPU_FP64_ACTIVE = GPU_PREFIX + "fp64_active_ratio"  # ~ DCGM_FI_PROF_PIPE_FP64_ACTIVE
GPU_FP32_ACTIVE = GPU_PREFIX + "fp32_active_ratio"  # ~ DCGM_FI_PROF_PIPE_FP32_ACTIVE
GPU_FP16_ACTIVE = GPU_PREFIX + "fp16_active_ratio"  # ~ DCGM_FI_PROF_PIPE_FP16_ACTIVE
GPU_PCIE_TX_RATE = GPU_PREFIX + "pcie_tx_bytes_per_second"  # ~ DCGM_FI_PROF_PCIE_TX_BYTES
GPU_PCIE_RX_RATE = GPU_PREFIX + "pcie_rx_bytes_per_second"  # ~ DCGM_FI_PROF_PCIE_RX_BYTES
GPU_NVLINK_TX_RATE = GPU_PREFIX + "nvlink_tx_bytes_per_second"  # ~ DCGM_FI_PROF_NVLINK_TX_BYTES
GPU_NVLINK_RX_RATE = GPU_PREFIX + "nvlink_rx_bytes_per_second"  # ~ DCGM_FI_PROF_NVLINK_RX_BYTES
# Exporter self-metrics (no GPU labels).
GPU_EXPORTER_GPM_DURATION = GPU_EXPORTER_PREFIX + "gpm_duration_seconds"  # GPM's cost per cycle
GPU_EXPORTER_NVML_UP = GPU_EXPORTER_PREFIX + "nvml_up"
GPU_EXPORTER_COLLECTION_DURATION = GPU_EXPORTER_PREFIX + "collection_duration_seconds"
GPU_EXPORTER_LAST_SUCCESS = GPU_EXPORTER_PREFIX + "last_success_timestamp_seconds"
GPU_EXPORTER_DATA_AGE = GPU_EXPORTER_PREFIX + "data_age_seconds"
GPU_EXPORTER_STALE = GPU_EXPORTER_PREFIX + "stale"  # 1: a cycle overran its deadline
GPU_EXPORTER_COLLECTIONS = GPU_EXPORTER_PREFIX + "collections_total"  # + result
GPU_EXPORTER_ERRORS = GPU_EXPORTER_PREFIX + "errors_total"  # + call, error
GPU_EXPORTER_XID_WATCH_UP = GPU_EXPORTER_PREFIX + "xid_watch_up"

# --- remediation service metrics ----------------------------------------------------------------
REMEDIATION_PREFIX = "trainwatch_remediation_"

# --- alert names (rules in alert_rules/, playbooks in remediation/playbooks/) -------------------
ALERTS_GPU = (
    "GpuTemperatureHigh",
    "GpuMemoryNearlyFull",
    "GpuUtilizationLowWhileTraining",
    "GpuXidErrors",
    "GpuEccUncorrectableErrors",
    "GpuRowRemapFailure",
    "GpuThrottled",
    "GpuLost",
    "GpuExporterDown",
    "GpuExporterStale",
)
ALERTS_TRAINING = (
    "TrainingLossSpike",
    "TrainingNonFiniteLoss",
    "TrainingGradNormExplosion",
    "TrainingThroughputDrop",
    "TrainingStalled",
    "TrainingJobVanished",
    "TrainingStragglerRank",
    "TrainingCudaOom",
    "TrainingNcclTimeout",
    "TrainingNcclError",
)
ALERTS_NODE = ("NodeDiskFilling", "NodeDiskFillingPredicted", "NodeMemoryHigh", "NodeDown")
ALERTS_STACK = (
    "TargetDown",
    "RemediationActionFailed",
    "RemediationCircuitBreakerOpen",
    "AlertmanagerNotificationsFailing",
    "Watchdog",
)
