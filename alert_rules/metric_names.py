"""Metric names the rules and dashboards use that exporters/catalog.py does not define (yet).

The catalog names the contract's fixed metrics; the GPU exporter's per-field gauges, the
remediation service's counters and third-party exporters' metrics are named here, once, so
rules, dashboards and the cross-check test share one spelling. When a name moves into the
catalog, import it from there instead.
"""

from __future__ import annotations

from exporters import catalog

# --- GPU exporter (labels gpu, uuid, name; + instance, job from the scrape) ---------------
GPU_TEMPERATURE = catalog.GPU_PREFIX + "temperature_celsius"
GPU_MEMORY_USED = catalog.GPU_PREFIX + "memory_used_bytes"
GPU_MEMORY_TOTAL = catalog.GPU_PREFIX + "memory_total_bytes"
GPU_UTILIZATION = catalog.GPU_PREFIX + "utilization_ratio"
GPU_CLOCK_EVENT_REASON = catalog.GPU_PREFIX + "clock_event_reason_active"  # label reason; 0/1
GPU_ECC_ERRORS = catalog.GPU_PREFIX + "ecc_errors_total"  # labels error_type, counter
GPU_REMAPPED_ROWS_FAILURE = catalog.GPU_PREFIX + "row_remap_failure"
GPU_POWER_USAGE = catalog.GPU_PREFIX + "power_usage_watts"
GPU_UP = catalog.GPU_UP
GPU_XID_ERRORS = catalog.GPU_XID_ERRORS
GPU_EXPORTER_LAST_SUCCESS = catalog.GPU_EXPORTER_PREFIX + "last_success_timestamp_seconds"
# uncorrectable errors since the driver loaded (the aggregate counter repeats the same events
# and is not supported everywhere)
GPU_ECC_UNCORRECTED = 'error_type="uncorrected",counter="volatile"'

# --- remediation service --------------------------------------------------------------------
# labels playbook, action, result
REMEDIATION_ACTIONS = catalog.REMEDIATION_PREFIX + "actions_total"
REMEDIATION_ACTION_FAILED = 'result="failed"'
REMEDIATION_CIRCUIT_BREAKER_OPEN = catalog.REMEDIATION_PREFIX + "circuit_breaker_open"

# --- node_exporter --------------------------------------------------------------------------
NODE_FS_AVAIL = "node_filesystem_avail_bytes"
NODE_FS_SIZE = "node_filesystem_size_bytes"
NODE_FS_READONLY = "node_filesystem_readonly"
NODE_MEM_AVAILABLE = "node_memory_MemAvailable_bytes"
NODE_MEM_TOTAL = "node_memory_MemTotal_bytes"

# --- Alertmanager self-metrics --------------------------------------------------------------
AM_NOTIFICATIONS = "alertmanager_notifications_total"
AM_NOTIFICATIONS_FAILED = "alertmanager_notifications_failed_total"
