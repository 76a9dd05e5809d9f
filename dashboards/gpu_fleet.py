"""GPU fleet: every GPU at a glance, to spot the sick or idle ones."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as gd

from dashboards.panels import (
    SCOPE,
    Q,
    add_panels,
    gpus_with_errors,
    instance_label_variable,
    scoped_dashboard,
    stat_panel,
    timeseries_panel,
)
from trainwatch.exporters.contract import catalog as c

UID = "trainwatch-gpu-fleet"
G = f'{SCOPE},gpu=~"$gpu"'
WHO = "{{instance}} GPU {{gpu}}"
ECC_UNCORRECTED = f'{c.GPU_ECC_ERRORS}{{{G},error_type="uncorrected",counter="volatile"}}'


def build() -> gd.Dashboard:
    dashboard = scoped_dashboard(
        UID, "Trainwatch / GPU fleet",
        "All GPUs of the fleet: health, load, memory, heat and errors.", ["gpu"],
        c.GPU_UP, instance_label_variable("gpu", "GPU", c.GPU_UP))
    return add_panels(
        dashboard,
        stat_panel("GPUs healthy", f"GPUs NVML can talk to ({c.GPU_UP} == 1).", "none",
                   Q(f"sum({c.GPU_UP}{{{G}}})")),
        stat_panel("GPUs lost", "GPUs NVML lost (fell off the bus, failed reset). Anything "
                   "above 0 is a GpuLost alert.", "none",
                   Q(f"count({c.GPU_UP}{{{G}}} == 0) or vector(0)")),
        stat_panel("Mean utilization", "Average busy fraction over all selected GPUs.",
                   "percentunit", Q(f"avg({c.GPU_UTILIZATION}{{{G}}})")),
        stat_panel("Hottest GPU", "Highest GPU temperature right now.", "celsius",
                   Q(f"max({c.GPU_TEMPERATURE}{{{G}}})")),
        timeseries_panel("GPU utilization", "Fraction of time a kernel was running, per GPU. "
                         "Low while a job trains means an input or straggler problem.",
                         "percentunit", Q(f"{c.GPU_UTILIZATION}{{{G}}}", WHO),
                         min_value=0),
        timeseries_panel("GPU memory used", "Used / total device memory per GPU. PyTorch's "
                         "caching allocator keeps memory reserved, so high is normal; a plateau "
                         "at the top is not.", "percentunit",
                         Q(f"instance_gpu:trainwatch_gpu_memory_used_bytes:ratio{{{G}}}", WHO),
                         min_value=0),
        timeseries_panel("GPU temperature", "Core temperature per GPU; thermal slowdown starts "
                         "around 87-90 C.", "celsius",
                         Q(f"{c.GPU_TEMPERATURE}{{{G}}}", WHO)),
        timeseries_panel("GPU power", "Power draw per GPU.", "watt",
                         Q(f"{c.GPU_POWER_USAGE}{{{G}}}", WHO), min_value=0),
        timeseries_panel("Throttled GPUs by reason", "Number of GPUs with each clock-event "
                         "(throttle) reason active; \"none\" is 0 while no GPU has any. "
                         "sw_power_cap is normal at full load; thermal and power-brake reasons "
                         "are not.", "none",
                         # the exporter serves a reason only while it is active
                         Q(f"sum by (reason) ({c.GPU_CLOCK_EVENT_REASON}{{{G}}})\n"
                           'or on () label_replace(vector(0), "reason", "none", "", "")',
                           "{{reason}}"), min_value=0),
        timeseries_panel("Uncorrectable ECC errors", "New uncorrectable ECC errors per GPU "
                         "(volatile counter), and how many GPUs have any since their driver "
                         "loaded (the exporter serves the counter from the first error, so "
                         "that count is what shows a GPU's first one). Any non-zero value "
                         "means corrupted memory.", "none",
                         Q(f"increase({ECC_UNCORRECTED}[$__rate_interval])", WHO),
                         Q(gpus_with_errors(ECC_UNCORRECTED), "GPUs with errors"), min_value=0),
        timeseries_panel("XID errors", "XID events reported by the driver, per GPU and XID code, "
                         "and how many GPUs reported any since their exporter started (the "
                         "exporter serves a GPU's XID counter from its first XID, so that "
                         "count is what shows the first one).", "none",
                         Q(f"increase({c.GPU_XID_ERRORS}{{{G}}}[$__rate_interval])",
                           "{{instance}} GPU {{gpu}} XID {{xid}}"),
                         Q(gpus_with_errors(f"{c.GPU_XID_ERRORS}{{{G}}}"), "GPUs with XIDs"),
                         min_value=0),
        timeseries_panel("Energy use", "Energy drawn per node (sum of its GPUs).", "watt",
                         Q(f"sum by (instance) (rate({c.GPU_ENERGY}{{{G}}}"
                           f"[$__rate_interval]))", "{{instance}}"), min_value=0),
    )
