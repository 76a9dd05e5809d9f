"""Every metric name the GPU exporter emits, defined once.

Units are base units (bytes, watts, celsius, hertz, joules, ratio 0-1). Per-GPU series carry
the labels `gpu`, `uuid`, `name` (exporters.catalog.GPU_LABELS). Alert rules and dashboards
import these names rather than re-typing them.
"""

from __future__ import annotations

from exporters.catalog import (
    GPU_EXPORTER_PREFIX,
    GPU_EXPORTER_SIMULATED,
    GPU_PREFIX,
    GPU_UP,
    GPU_XID_ERRORS,
)

# --- health and identity ---------------------------------------------------------------------
UP = GPU_UP
INFO = GPU_PREFIX + "info"  # + pci_bus_id; value 1
DRIVER_INFO = GPU_PREFIX + "driver_info"  # labels driver_version, cuda_version; value 1
XID_ERRORS = GPU_XID_ERRORS  # + label xid

# --- per-GPU gauges / counters ---------------------------------------------------------------
UTILIZATION = GPU_PREFIX + "utilization_ratio"
MEMORY_UTILIZATION = GPU_PREFIX + "memory_utilization_ratio"
MEMORY_USED = GPU_PREFIX + "memory_used_bytes"
MEMORY_FREE = GPU_PREFIX + "memory_free_bytes"
MEMORY_TOTAL = GPU_PREFIX + "memory_total_bytes"
TEMPERATURE = GPU_PREFIX + "temperature_celsius"
POWER_USAGE = GPU_PREFIX + "power_usage_watts"
POWER_LIMIT = GPU_PREFIX + "power_limit_watts"  # enforced limit
POWER_LIMIT_MIN = GPU_PREFIX + "power_limit_min_watts"
POWER_LIMIT_MAX = GPU_PREFIX + "power_limit_max_watts"
POWER_LIMIT_DEFAULT = GPU_PREFIX + "power_limit_default_watts"
ENERGY = GPU_PREFIX + "energy_joules_total"
SM_CLOCK = GPU_PREFIX + "sm_clock_hertz"
MEMORY_CLOCK = GPU_PREFIX + "memory_clock_hertz"
CLOCK_EVENT_REASON = GPU_PREFIX + "clock_event_reason_active"  # + label reason; 0/1
ECC_ERRORS = GPU_PREFIX + "ecc_errors_total"  # + labels error_type, counter
REMAPPED_ROWS = GPU_PREFIX + "remapped_rows"  # + label cause (correctable|uncorrectable)
REMAP_PENDING = GPU_PREFIX + "row_remap_pending"
REMAP_FAILURE = GPU_PREFIX + "row_remap_failure"
PCIE_LINK_GENERATION = GPU_PREFIX + "pcie_link_generation"
PCIE_LINK_WIDTH = GPU_PREFIX + "pcie_link_width"
PCIE_REPLAYS = GPU_PREFIX + "pcie_replays_total"
NVLINK_UP = GPU_PREFIX + "nvlink_up"  # + label link
NVLINK_ERRORS = GPU_PREFIX + "nvlink_errors_total"  # + labels link, counter
PROCESSES = GPU_PREFIX + "processes"
PROCESS_MEMORY = GPU_PREFIX + "process_memory_used_bytes"  # + labels training_job, rank
MIG_ENABLED = GPU_PREFIX + "mig_enabled"
MIG_MEMORY_USED = GPU_PREFIX + "mig_memory_used_bytes"  # + labels mig_index, mig_uuid
MIG_MEMORY_TOTAL = GPU_PREFIX + "mig_memory_total_bytes"

# --- exporter self-metrics -------------------------------------------------------------------
SIMULATED = GPU_EXPORTER_SIMULATED
NVML_UP = GPU_EXPORTER_PREFIX + "nvml_up"
COLLECTION_DURATION = GPU_EXPORTER_PREFIX + "collection_duration_seconds"
LAST_SUCCESS = GPU_EXPORTER_PREFIX + "last_success_timestamp_seconds"
DATA_AGE = GPU_EXPORTER_PREFIX + "data_age_seconds"
STALE = GPU_EXPORTER_PREFIX + "stale"
COLLECTIONS = GPU_EXPORTER_PREFIX + "collections_total"  # + label result
ERRORS = GPU_EXPORTER_PREFIX + "errors_total"  # + labels call, error
XID_WATCH_UP = GPU_EXPORTER_PREFIX + "xid_watch_up"

PER_GPU_METRICS: tuple[str, ...] = (
    UP, INFO, XID_ERRORS, UTILIZATION, MEMORY_UTILIZATION, MEMORY_USED, MEMORY_FREE,
    MEMORY_TOTAL, TEMPERATURE, POWER_USAGE, POWER_LIMIT, POWER_LIMIT_MIN, POWER_LIMIT_MAX,
    POWER_LIMIT_DEFAULT, ENERGY, SM_CLOCK, MEMORY_CLOCK, CLOCK_EVENT_REASON, ECC_ERRORS,
    REMAPPED_ROWS, REMAP_PENDING, REMAP_FAILURE, PCIE_LINK_GENERATION, PCIE_LINK_WIDTH,
    PCIE_REPLAYS, NVLINK_UP, NVLINK_ERRORS, PROCESSES, PROCESS_MEMORY, MIG_ENABLED,
    MIG_MEMORY_USED, MIG_MEMORY_TOTAL,
)
SELF_METRICS: tuple[str, ...] = (
    SIMULATED, NVML_UP, COLLECTION_DURATION, LAST_SUCCESS, DATA_AGE, STALE, COLLECTIONS,
    ERRORS, XID_WATCH_UP, DRIVER_INFO,
)
ALL_METRICS: tuple[str, ...] = PER_GPU_METRICS + SELF_METRICS
