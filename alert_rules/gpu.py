"""GPU alerts: hardware health, thermal state, memory, utilization, and the exporter itself."""

from __future__ import annotations

from alert_rules import gpu_source, recording
from alert_rules.config import Profile
from alert_rules.model import Alert, Group, alert_groups
from alert_rules.promql import new_events, sel, with_host, with_node, without_host
from trainwatch.exporters.contract import catalog
from trainwatch.remediation.faults import FaultTable, load_table

# uncorrectable errors since the driver loaded (the aggregate counter repeats the same events
# and is not supported everywhere)
UNCORRECTED_SINCE_DRIVER_LOAD = 'error_type="uncorrected",counter="volatile"'

GPU_ID = "GPU {{ $labels.gpu }} ({{ $labels.name }}, {{ $labels.uuid }}) on {{ $labels.node }}"


def groups(p: Profile) -> list[Group]:
    gpu = p.selector("gpu")
    a = p.alert
    alerts: list[Alert] = [
        Alert(
            "GpuTemperatureHigh",
            with_node(f"{sel(catalog.GPU_TEMPERATURE, gpu)} > "
                      f"{a('GpuTemperatureHigh')['threshold_celsius']}"),
            "warning", "gpu",
            f"{GPU_ID} is at {{{{ $value }}}} C",
            f"{GPU_ID} has been above {a('GpuTemperatureHigh')['threshold_celsius']} C for "
            f"{a('GpuTemperatureHigh')['for']}. The GPU will slow its clocks and training "
            "throughput on every rank drops. Trainwatch lowers the power limit automatically "
            "(gpu_power_limit playbook) and restores it when the alert resolves; check cooling "
            "and fans if it keeps coming back.",
            for_=a("GpuTemperatureHigh")["for"],
        ),
        Alert(
            "GpuMemoryNearlyFull",
            with_node(f"{recording.GPU_MEMORY_USED_RATIO}{{{gpu}}} > "
                      f"{a('GpuMemoryNearlyFull')['threshold_ratio']}"),
            "warning", "gpu",
            f"{GPU_ID} memory is {{{{ $value | humanizePercentage }}}} full",
            f"{GPU_ID} has used more than "
            f"{a('GpuMemoryNearlyFull')['threshold_ratio'] * 100:g}% of its memory for "
            f"{a('GpuMemoryNearlyFull')['for']}. The next larger batch, longer sequence or "
            "fragmentation will raise a CUDA out-of-memory error and kill the job.",
            for_=a("GpuMemoryNearlyFull")["for"],
        ),
        _utilization_low(p),
        *_xid(p),
        Alert(
            "GpuEccUncorrectableErrors",
            with_node(new_events(sel(catalog.GPU_ECC_ERRORS, gpu, UNCORRECTED_SINCE_DRIVER_LOAD),
                                 a("GpuEccUncorrectableErrors")["window"])),
            "critical", "gpu",
            f"{GPU_ID} has uncorrectable ECC errors",
            f"{GPU_ID} counted uncorrectable ECC memory errors "
            f"within the last {a('GpuEccUncorrectableErrors')['window']}. Data on this GPU may be "
            "corrupt: the job's results since the error are suspect. Drain the node and reset "
            "the GPU.",
            for_=a("GpuEccUncorrectableErrors")["for"],
        ),
        Alert(
            "GpuRowRemapFailure",
            with_node(f"{sel(catalog.GPU_ROW_REMAP_FAILURE, gpu)} > 0"),
            "critical", "gpu",
            f"{GPU_ID} failed to remap a memory row",
            f"{GPU_ID} reports a failed row remapping: it has no spare rows left for a failing "
            "memory cell. The GPU needs an RMA; take the node out of the training pool.",
            for_=a("GpuRowRemapFailure")["for"],
        ),
        Alert(
            "GpuThrottled",
            # only the active reasons reach the aggregation (none, normally)
            with_node(f"max without (reason) "
                      f"({sel(catalog.GPU_CLOCK_EVENT_REASON, gpu, _reasons(p))} > 0)"),
            "warning", "gpu",
            f"{GPU_ID} is throttling its clocks",
            f"{GPU_ID} has been slowing its clocks for thermal or power-brake reasons for "
            f"{a('GpuThrottled')['for']}. In data-parallel training the slowest GPU sets the "
            "pace of every rank. Check temperature, power and the clock-event reason panel.",
            for_=a("GpuThrottled")["for"],
        ),
        Alert(
            "GpuLost",
            # aggregated: the exporter's flag that exists only for a lost GPU, where `up == 0`
            # reads every GPU's series every round
            with_node(sel(catalog.GPU_LOST, gpu) if p.aggregate
                      else f"{sel(catalog.GPU_UP, gpu)} == 0"),
            "critical", "gpu",
            f"{GPU_ID} is lost",
            f"NVML cannot talk to {GPU_ID} (fallen off the bus, XID 79, or a failed reset). "
            "Any job using it is hung or dead. Drain the node; a reboot or GPU reset is needed.",
            for_=a("GpuLost")["for"],
        ),
        Alert(
            "GpuExporterDown",
            with_node(f"up{{{gpu}}} == 0"),
            "warning", "gpu",
            "GPU exporter on {{ $labels.node }} is down",
            "Prometheus cannot scrape the Trainwatch GPU exporter at {{ $labels.instance }} "
            f"for {a('GpuExporterDown')['for']}. GPU alerts for that node are blind until it is "
            "back.",
            for_=a("GpuExporterDown")["for"],
        ),
        _stale(p),
    ]
    return alert_groups("gpu", alerts, p.alert_interval, p.alert_group_suffix)


def _reasons(p: Profile) -> str:
    return f'reason=~"{p.alert("GpuThrottled")["reasons"]}"'


def _utilization_low(p: Profile) -> Alert:
    cfg = p.alert("GpuUtilizationLowWhileTraining")
    window = cfg["window"]
    util = (f"{recording.GPU_UTILIZATION_AVG}{{{p.selector('gpu')}}}"
            if recording.utilization_recorded(p) else recording.gpu_utilization_avg(p))
    stepping = recording.STEPPING_JOBS if p.aggregate else recording.stepping(p)
    # GPU and training series of one machine share the scrape host, whatever their labels say;
    # the threshold first, so the label rewriting runs on the idle GPUs only
    idle = f"{util} < {cfg['threshold_ratio']}"
    joined = f"{with_host(idle)}\nand on (host)\ncount by (host) ({with_host(stepping)})"
    expr = with_node(without_host(joined))
    return Alert(
        "GpuUtilizationLowWhileTraining", expr, "warning", "gpu",
        f"{GPU_ID} is idle while a job trains on that node",
        f"{GPU_ID} averaged {{{{ $value | humanizePercentage }}}} utilization over {window} "
        "while a training job on the same node kept stepping. Typical causes: the input "
        "pipeline cannot keep up (check training_data_wait_seconds), the job does not use "
        "this GPU, or a rank is waiting on a slow peer.",
        for_=cfg["for"],
    )


# What the remediation service does for an XID of a class, by the class's action in the fault
# table (remediation/faults.py ACTIONS), for the alert's description.
XID_ACTION_TEXT = {
    "quarantine": "Trainwatch drains the node and requeues the job, which resumes from its "
                  "newest committed checkpoint on the nodes in service (node_quarantine "
                  "playbook, where the remediation service has a scheduler).",
    "restart": "Trainwatch restarts the job from its newest committed checkpoint and leaves the "
               "node in service (where the remediation service has a scheduler).",
    "none": "Nothing automatic.",
}


def _xid(p: Profile) -> list[Alert]:
    """GpuXidErrors, one rule per class of the fault table (remediation/fault_classes.yaml) an
    XID can fall in: each selects that class's XIDs (the class of unlisted XIDs selects every
    XID no other class lists) and carries the class's severity, a `fault_class` label and its
    text, so no XID number is written here.

    Trainwatch counts XIDs per XID (the `xid` label); dcgm-exporter exports the last XID as a
    gauge value, so there a new XID is a change of that value to a non-zero one (the XID is the
    alert value; the same XID twice in a row is not seen)."""
    table = load_table()
    return [_xid_class(p, table, cls) for cls in table.xid_classes()]


def _xid_class(p: Profile, table: FaultTable, cls: str) -> Alert:
    cfg = p.alert("GpuXidErrors")
    window = cfg["window"]
    fault = table.classes[cls]
    if cls == table.unknown_xid:  # every XID but those of the other classes
        listed = tuple(x for other in table.xid_classes() if other != cls
                       for x in table.xids_of(other))
        keep = False
    else:
        listed, keep = table.xids_of(cls), True
    if gpu_source.source(p) == gpu_source.DCGM:
        last = sel(gpu_source.XID, p.selector("gpu"))
        new = f"{last} > 0\nand\n({new_events(last, window).replace('increase(', 'changes(')})"
        values = " or ".join(f"{last} == {x}" for x in sorted(listed))
        if values:
            new = f"({new})\n{'and' if keep else 'unless'}\n({values})"
        expr = with_node(gpu_source.dcgm_labels(new))
        xid = "{{ $value }}"
    else:
        alternatives = "|".join(str(x) for x in sorted(listed))
        matcher = f'xid{"=~" if keep else "!~"}"{alternatives}"' if alternatives else ""
        expr = with_node(new_events(sel(catalog.GPU_XID_ERRORS, p.selector("gpu"), matcher),
                                    window))
        xid = "{{ $labels.xid }}"
    return Alert(
        "GpuXidErrors", expr, fault.severity, "gpu",
        f"{GPU_ID} reported XID {xid} ({cls})",
        f"The NVIDIA driver reported XID {xid} on {GPU_ID} within the last {window}. "
        f"Trainwatch's fault table (remediation/fault_classes.yaml) classes it {cls}: "
        f"{fault.description}. {XID_ACTION_TEXT[fault.action]} The runbook's XID table says "
        "what to do.",
        for_=cfg["for"],
        labels={"fault_class": cls},
    )


def _stale(p: Profile) -> Alert:
    """Trainwatch exports when NVML last answered. dcgm-exporter does not; a powered GPU's
    energy counter always moves, so every GPU of an exporter frozen for the same time is."""
    cfg = p.alert("GpuExporterStale")
    gpu = p.selector("gpu")
    max_age = cfg["max_age_seconds"]
    if gpu_source.source(p) == gpu_source.DCGM:
        energy = sel(gpu_source.ENERGY, gpu)
        by = "max by (job, instance, node)"
        # two samples at least, so a scrape interval longer than the window cannot fire it
        expr = with_node(f"{by} (changes({energy}[{max_age}s])) == 0\n"
                         f"and\n{by} (count_over_time({energy}[{max_age}s])) >= 2")
        description = ("dcgm-exporter at {{ $labels.instance }} still answers scrapes but no "
                       f"GPU's energy counter has moved for {max_age}s, and a powered GPU "
                       "always draws energy: the numbers are frozen. DCGM or the driver is "
                       "probably stuck.")
    else:
        expr = with_node(f"time() - {sel(catalog.GPU_EXPORTER_LAST_SUCCESS, gpu)} > {max_age}")
        description = ("The GPU exporter at {{ $labels.instance }} still answers scrapes but "
                       "its last successful NVML poll was {{ $value | humanizeDuration }} ago: "
                       "the numbers are frozen. An NVML call is probably hanging (driver "
                       "trouble).")
    return Alert("GpuExporterStale", expr, "warning", "gpu",
                 "GPU metrics on {{ $labels.node }} are stale", description, for_=cfg["for"])
