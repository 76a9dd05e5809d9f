"""One source of truth for the names other parts of Trainwatch rely on.

Alert rules, dashboards, Ansible defaults and tests all refer to these names; a test checks
that every metric used in a rule or a panel is one that an exporter really emits. Keep this
module dependency-free so any part (including the training client) can import it cheaply.
See docs/contracts.md for the prose version.
"""

from __future__ import annotations

# --- default ports (production). The local inventory and the tests override them. ---------
PORTS: dict[str, int] = {
    "prometheus": 9090,
    "alertmanager": 9093,
    "node_exporter": 9100,
    "gpu_exporter": 9445,
    "training_exporter": 9446,
    "logscan": 9447,
    "remediation": 9448,
}

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
DEFAULT_EXPORTER_SOCKET = "/run/trainwatch/training.sock"

# --- training exporter metrics (labels: training_job, rank, node) ----------------------------
TRAINING_STEP = "training_step"
TRAINING_LOSS = "training_loss"
TRAINING_LEARNING_RATE = "training_learning_rate"
TRAINING_GRAD_NORM = "training_grad_norm"
TRAINING_STEP_DURATION = "training_step_duration_seconds"  # histogram
TRAINING_SAMPLES = "training_samples_total"
TRAINING_TOKENS = "training_tokens_total"
TRAINING_LAST_STEP_TIMESTAMP = "training_last_step_timestamp_seconds"
TRAINING_NONFINITE_LOSS = "training_nonfinite_loss_total"
TRAINING_DROPPED_SAMPLES = "training_dropped_samples_total"
TRAINING_WORLD_SIZE = "training_world_size"
TRAINING_RESTARTS = "training_restarts"
TRAINING_COMMANDS_APPLIED = "training_commands_applied_total"  # + label "command"
TRAINING_ROLLBACKS = "training_rollbacks_total"
TRAINING_DATA_WAIT = "training_data_wait_seconds"
TRAINING_CUDA_MEM_ALLOCATED = "training_cuda_memory_allocated_bytes"
TRAINING_CUDA_MEM_RESERVED = "training_cuda_memory_reserved_bytes"
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
