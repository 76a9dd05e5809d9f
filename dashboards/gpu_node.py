"""GPU node detail: one node's GPUs in depth, for the engineer chasing a hardware alert."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as gd

from dashboards.panels import (
    SCOPE,
    Q,
    add_panels,
    gpus_with_errors,
    instance_label_variable,
    scoped_dashboard,
    table_panel,
    timeseries_panel,
)
from trainwatch.exporters.contract import catalog as c

UID = "trainwatch-gpu-node"
G = f'{SCOPE},gpu=~"$gpu"'
E = SCOPE
WHO = "GPU {{gpu}}"


def build() -> gd.Dashboard:
    dashboard = scoped_dashboard(
        UID, "Trainwatch / GPU node detail",
        "One node's GPUs in depth: clocks, throttling, memory errors, links and the "
        "exporter itself.", ["gpu"],
        c.GPU_UP, instance_label_variable("gpu", "GPU", c.GPU_UP))
    return add_panels(
        dashboard,
        table_panel("GPU inventory", "Every GPU on the node with its product name, UUID and "
                    "PCI bus id (value 1 = present).", "none",
                    Q(f"{c.GPU_INFO}{{{G}}}")),
        timeseries_panel("Memory used", "Device memory used per GPU, in bytes, as nvidia-smi "
                         "shows it; reserved is the driver's own share (absent on drivers "
                         "without NVML's v2 memory info, whose 'used' includes it).", "bytes",
                         Q(f"{c.GPU_MEMORY_USED}{{{G}}}", WHO),
                         Q(f"{c.GPU_MEMORY_RESERVED}{{{G}}}", WHO + " reserved"),
                         Q(f"{c.GPU_MEMORY_TOTAL}{{{G}}}", WHO + " total")),
        timeseries_panel("Profiling: SM, tensor and DRAM activity", "What the GPU's units did, "
                         "from NVML GPM (Hopper and newer) or dcgm-exporter's DCGM_FI_PROF_*. "
                         "'Utilization' only says a kernel ran: an H100 at 100% utilization "
                         "measured 62% SM and 60% tensor activity. Absent where unsupported.",
                         "percentunit",
                         Q(f"{c.GPU_SM_ACTIVE}{{{G}}}", WHO + " SM active"),
                         Q(f"{c.GPU_TENSOR_ACTIVE}{{{G}}}", WHO + " tensor"),
                         Q(f"{c.GPU_DRAM_ACTIVE}{{{G}}}", WHO + " DRAM"),
                         min_value=0),
        timeseries_panel("PCIe and NVLink throughput", "Bytes per second over PCIe and all "
                         "NVLink links, per GPU and direction (GPM or DCGM profiling).", "Bps",
                         Q(f"{c.GPU_PCIE_TX_RATE}{{{G}}}", WHO + " PCIe tx"),
                         Q(f"{c.GPU_PCIE_RX_RATE}{{{G}}}", WHO + " PCIe rx"),
                         Q(f"{c.GPU_NVLINK_TX_RATE}{{{G}}}",
                           WHO + " NVLink tx"),
                         Q(f"{c.GPU_NVLINK_RX_RATE}{{{G}}}",
                           WHO + " NVLink rx"), min_value=0),
        timeseries_panel("SM clock", "Streaming-multiprocessor clock per GPU; a drop under load "
                         "means throttling.", "hertz",
                         Q(f"{c.GPU_SM_CLOCK}{{{G}}}", WHO)),
        timeseries_panel("Power usage and limit", "Power draw against the enforced limit "
                         "(Trainwatch's gpu_power_limit playbook lowers the limit).", "watt",
                         Q(f"{c.GPU_POWER_USAGE}{{{G}}}", WHO),
                         Q(f"{c.GPU_POWER_LIMIT}{{{G}}}", WHO + " limit")),
        timeseries_panel("Clock-event reasons", "1 while a throttle reason is active, per "
                         "GPU and reason; a GPU with no reason active reads 0.", "none",
                         # the exporter serves a reason only while it is active
                         Q(f"{c.GPU_CLOCK_EVENT_REASON}{{{G}}}\nor on (job, instance, gpu)\n"
                           f"{c.GPU_UP}{{{G}}} * 0", WHO + " {{reason}}")),
        timeseries_panel("ECC errors", "New ECC errors per GPU, type and counter "
                         "(corrected errors are absorbed; uncorrected corrupt memory), and how "
                         "many GPUs have any (the exporter serves a counter from its first "
                         "error, so that count is what shows the first one).", "none",
                         Q(f"increase({c.GPU_ECC_ERRORS}{{{G}}}[$__rate_interval])",
                           WHO + " {{error_type}} {{counter}}"),
                         Q(gpus_with_errors(f"{c.GPU_ECC_ERRORS}{{{G}}}"), "GPUs with errors")),
        timeseries_panel("Remapped rows", "Rows remapped for correctable/uncorrectable causes, "
                         "a pending remap (needs a GPU reset) and remap failure (needs RMA).",
                         "none",
                         Q(f"{c.GPU_REMAPPED_ROWS}{{{G}}}", WHO + " {{cause}}"),
                         Q(f"{c.GPU_ROW_REMAP_PENDING}{{{G}}}", WHO + " pending"),
                         # served only while a remap failed: 0 for every other GPU
                         Q(f"{c.GPU_ROW_REMAP_FAILURE}{{{G}}}\nor on (job, instance, gpu)\n"
                           f"{c.GPU_UP}{{{G}}} * 0", WHO + " failure")),
        timeseries_panel("PCIe replays", "PCIe replay rate per GPU; a rising rate points at a "
                         "bad riser, slot or cable.", "ops",
                         Q(f"rate({c.GPU_PCIE_REPLAYS}{{{G}}}[$__rate_interval])",
                           WHO)),
        timeseries_panel("NVLink errors", "NVLink error rate per GPU, link and counter.", "ops",
                         Q(f"rate({c.GPU_NVLINK_ERRORS}{{{G}}}[$__rate_interval])",
                           WHO + " link {{link}} {{counter}}")),
        timeseries_panel("Processes and their memory", "Compute processes per GPU, and the "
                         "device memory of each training rank on it.", "bytes",
                         Q(f"{c.GPU_PROCESS_MEMORY}{{{G}}}",
                           WHO + " {{training_job}} rank {{rank}}")),
        timeseries_panel("Exporter data age", "Seconds since the GPU exporter's data was "
                         "collected; above a few intervals means NVML is hanging "
                         "(GpuExporterStale).", "s",
                         Q(f"{c.GPU_EXPORTER_DATA_AGE}{{{E}}}", "{{instance}}")),
        timeseries_panel("Exporter collection duration", "Time one NVML collection cycle took, "
                         "and the part of it spent in GPM calls.",
                         "s", Q(f"{c.GPU_EXPORTER_COLLECTION_DURATION}{{{E}}}",
                                "{{instance}}"),
                         Q(f"{c.GPU_EXPORTER_GPM_DURATION}{{{E}}}",
                           "{{instance}} GPM")),
    )
