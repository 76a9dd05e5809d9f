"""GPU fleet: every GPU at a glance, to spot the sick or idle ones."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as gd

from dashboards.panels import (
    Q,
    add_panels,
    new_dashboard,
    query_variable,
    stat_panel,
    timeseries_panel,
    with_scope_variables,
)

UID = "trainwatch-gpu-fleet"
G = 'cluster=~"$cluster",job=~"$job",instance=~"$instance",gpu=~"$gpu"'
WHO = "{{instance}} GPU {{gpu}}"


def build() -> gd.Dashboard:
    dashboard = (
        with_scope_variables(new_dashboard(
            UID, "Trainwatch / GPU fleet",
            "All GPUs of the fleet: health, load, memory, heat and errors.", ["gpu"]),
            "trainwatch_gpu_up")
        .with_variable(query_variable(
            "gpu", "GPU",
            'label_values(trainwatch_gpu_up{job=~"$job",instance=~"$instance"}, gpu)'))
    )
    return add_panels(
        dashboard,
        stat_panel("GPUs healthy", "GPUs NVML can talk to (trainwatch_gpu_up == 1).", "none",
                   Q(f"sum(trainwatch_gpu_up{{{G}}})")),
        stat_panel("GPUs lost", "GPUs NVML lost (fell off the bus, failed reset). Anything "
                   "above 0 is a GpuLost alert.", "none",
                   Q(f"count(trainwatch_gpu_up{{{G}}} == 0) or vector(0)")),
        stat_panel("Mean utilization", "Average busy fraction over all selected GPUs.",
                   "percentunit", Q(f"avg(trainwatch_gpu_utilization_ratio{{{G}}})")),
        stat_panel("Hottest GPU", "Highest GPU temperature right now.", "celsius",
                   Q(f"max(trainwatch_gpu_temperature_celsius{{{G}}})")),
        timeseries_panel("GPU utilization", "Fraction of time a kernel was running, per GPU. "
                         "Low while a job trains means an input or straggler problem.",
                         "percentunit", Q(f"trainwatch_gpu_utilization_ratio{{{G}}}", WHO),
                         min_value=0),
        timeseries_panel("GPU memory used", "Used / total device memory per GPU. PyTorch's "
                         "caching allocator keeps memory reserved, so high is normal; a plateau "
                         "at the top is not.", "percentunit",
                         Q(f"instance_gpu:trainwatch_gpu_memory_used_bytes:ratio{{{G}}}", WHO),
                         min_value=0),
        timeseries_panel("GPU temperature", "Core temperature per GPU; thermal slowdown starts "
                         "around 87-90 C.", "celsius",
                         Q(f"trainwatch_gpu_temperature_celsius{{{G}}}", WHO)),
        timeseries_panel("GPU power", "Power draw per GPU.", "watt",
                         Q(f"trainwatch_gpu_power_usage_watts{{{G}}}", WHO), min_value=0),
        timeseries_panel("Throttled GPUs by reason", "Number of GPUs with each clock-event "
                         "(throttle) reason active. sw_power_cap is normal at full load; thermal "
                         "and power-brake reasons are not.", "none",
                         Q(f"sum by (reason) (trainwatch_gpu_clock_event_reason_active{{{G}}})",
                           "{{reason}}"), min_value=0),
        timeseries_panel("Uncorrectable ECC errors", "New uncorrectable ECC errors per GPU "
                         "(volatile counter). Any non-zero value means corrupted memory.",
                         "none",
                         Q(f'increase(trainwatch_gpu_ecc_errors_total{{{G},error_type="uncorrected",'
                           f'counter="volatile"}}[$__rate_interval])', WHO), min_value=0),
        timeseries_panel("XID errors", "XID events reported by the driver, per GPU and XID code.",
                         "none",
                         Q(f"increase(trainwatch_gpu_xid_errors_total{{{G}}}[$__rate_interval])",
                           "{{instance}} GPU {{gpu}} XID {{xid}}"), min_value=0),
        timeseries_panel("Energy use", "Energy drawn per node (sum of its GPUs).", "watt",
                         Q(f"sum by (instance) (rate(trainwatch_gpu_energy_joules_total{{{G}}}"
                           f"[$__rate_interval]))", "{{instance}}"), min_value=0),
    )
