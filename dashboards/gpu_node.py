"""GPU node detail: one node's GPUs in depth, for the engineer chasing a hardware alert."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as gd

from dashboards.panels import (
    Q,
    add_panels,
    new_dashboard,
    query_variable,
    table_panel,
    timeseries_panel,
    with_scope_variables,
)

UID = "trainwatch-gpu-node"
G = 'cluster=~"$cluster",job=~"$job",instance=~"$instance",gpu=~"$gpu"'
E = 'cluster=~"$cluster",job=~"$job",instance=~"$instance"'
WHO = "GPU {{gpu}}"


def build() -> gd.Dashboard:
    dashboard = (
        with_scope_variables(new_dashboard(
            UID, "Trainwatch / GPU node detail",
            "One node's GPUs in depth: clocks, throttling, memory errors, links and the "
            "exporter itself.", ["gpu"]), "trainwatch_gpu_up")
        .with_variable(query_variable(
            "gpu", "GPU",
            'label_values(trainwatch_gpu_up{job=~"$job",instance=~"$instance"}, gpu)'))
    )
    return add_panels(
        dashboard,
        table_panel("GPU inventory", "Every GPU on the node with its product name, UUID and "
                    "PCI bus id (value 1 = present).", "none",
                    Q(f"trainwatch_gpu_info{{{G}}}")),
        timeseries_panel("Memory used", "Device memory used per GPU, in bytes, as nvidia-smi "
                         "shows it; reserved is the driver's own share (absent on drivers "
                         "without NVML's v2 memory info, whose 'used' includes it).", "bytes",
                         Q(f"trainwatch_gpu_memory_used_bytes{{{G}}}", WHO),
                         Q(f"trainwatch_gpu_memory_reserved_bytes{{{G}}}", WHO + " reserved"),
                         Q(f"trainwatch_gpu_memory_total_bytes{{{G}}}", WHO + " total")),
        timeseries_panel("Profiling: SM, tensor and DRAM activity", "What the GPU's units did, "
                         "from NVML GPM (Hopper and newer) or dcgm-exporter's DCGM_FI_PROF_*. "
                         "'Utilization' only says a kernel ran: an H100 at 100% utilization "
                         "measured 62% SM and 60% tensor activity. Absent where unsupported.",
                         "percentunit",
                         Q(f"trainwatch_gpu_sm_active_ratio{{{G}}}", WHO + " SM active"),
                         Q(f"trainwatch_gpu_tensor_active_ratio{{{G}}}", WHO + " tensor"),
                         Q(f"trainwatch_gpu_dram_active_ratio{{{G}}}", WHO + " DRAM"),
                         min_value=0),
        timeseries_panel("PCIe and NVLink throughput", "Bytes per second over PCIe and all "
                         "NVLink links, per GPU and direction (GPM or DCGM profiling).", "Bps",
                         Q(f"trainwatch_gpu_pcie_tx_bytes_per_second{{{G}}}", WHO + " PCIe tx"),
                         Q(f"trainwatch_gpu_pcie_rx_bytes_per_second{{{G}}}", WHO + " PCIe rx"),
                         Q(f"trainwatch_gpu_nvlink_tx_bytes_per_second{{{G}}}",
                           WHO + " NVLink tx"),
                         Q(f"trainwatch_gpu_nvlink_rx_bytes_per_second{{{G}}}",
                           WHO + " NVLink rx"), min_value=0),
        timeseries_panel("SM clock", "Streaming-multiprocessor clock per GPU; a drop under load "
                         "means throttling.", "hertz",
                         Q(f"trainwatch_gpu_sm_clock_hertz{{{G}}}", WHO)),
        timeseries_panel("Power usage and limit", "Power draw against the enforced limit "
                         "(Trainwatch's gpu_power_limit playbook lowers the limit).", "watt",
                         Q(f"trainwatch_gpu_power_usage_watts{{{G}}}", WHO),
                         Q(f"trainwatch_gpu_power_limit_watts{{{G}}}", WHO + " limit")),
        timeseries_panel("Clock-event reasons", "1 while a throttle reason is active, per "
                         "GPU and reason.", "none",
                         Q(f"trainwatch_gpu_clock_event_reason_active{{{G}}}",
                           WHO + " {{reason}}")),
        timeseries_panel("ECC errors", "New ECC errors per GPU, type and counter "
                         "(corrected errors are absorbed; uncorrected corrupt memory).", "none",
                         Q(f"increase(trainwatch_gpu_ecc_errors_total{{{G}}}[$__rate_interval])",
                           WHO + " {{error_type}} {{counter}}")),
        timeseries_panel("Remapped rows", "Rows remapped for correctable/uncorrectable causes, "
                         "a pending remap (needs a GPU reset) and remap failure (needs RMA).",
                         "none",
                         Q(f"trainwatch_gpu_remapped_rows{{{G}}}", WHO + " {{cause}}"),
                         Q(f"trainwatch_gpu_row_remap_pending{{{G}}}", WHO + " pending"),
                         Q(f"trainwatch_gpu_row_remap_failure{{{G}}}", WHO + " failure")),
        timeseries_panel("PCIe replays", "PCIe replay rate per GPU; a rising rate points at a "
                         "bad riser, slot or cable.", "ops",
                         Q(f"rate(trainwatch_gpu_pcie_replays_total{{{G}}}[$__rate_interval])",
                           WHO)),
        timeseries_panel("NVLink errors", "NVLink error rate per GPU, link and counter.", "ops",
                         Q(f"rate(trainwatch_gpu_nvlink_errors_total{{{G}}}[$__rate_interval])",
                           WHO + " link {{link}} {{counter}}")),
        timeseries_panel("Processes and their memory", "Compute processes per GPU, and the "
                         "device memory of each training rank on it.", "bytes",
                         Q(f"trainwatch_gpu_process_memory_used_bytes{{{G}}}",
                           WHO + " {{training_job}} rank {{rank}}")),
        timeseries_panel("Exporter data age", "Seconds since the GPU exporter's data was "
                         "collected; above a few intervals means NVML is hanging "
                         "(GpuExporterStale).", "s",
                         Q(f"trainwatch_gpu_exporter_data_age_seconds{{{E}}}", "{{instance}}")),
        timeseries_panel("Exporter collection duration", "Time one NVML collection cycle took, "
                         "and the part of it spent in GPM calls.",
                         "s", Q(f"trainwatch_gpu_exporter_collection_duration_seconds{{{E}}}",
                                "{{instance}}"),
                         Q(f"trainwatch_gpu_exporter_gpm_duration_seconds{{{E}}}",
                           "{{instance}} GPM")),
    )
