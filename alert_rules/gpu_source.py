"""Where GPU metrics come from: Trainwatch's gpu-exporter, or NVIDIA's dcgm-exporter.

`gpu_source` in alert_rules/config.yml chooses. With `trainwatch` the alerts and dashboards
read the exporter's series directly and this module adds nothing. With `dcgm`, one recording
group (`gpu_source.yml`) records the `trainwatch_gpu_*` names the alerts, recording rules and
dashboards read from dcgm-exporter's counters, converted to base units (MiB -> bytes,
% -> ratio, MHz -> Hz, mJ -> J: each row's `dcgm_scale` in the metric table), with
dcgm-exporter's labels renamed to ours (UUID -> uuid,
modelName -> name, Hostname -> node where Prometheus attached none). Nothing else changes.

Counter names are exactly those of dcgm-exporter's `etc/default-counters.csv`
(NVIDIA/dcgm-exporter at d5e5f510a1b6, 2026-05-12), where they are on by default. Fields the
defaults leave commented out are mapped too, so they work once enabled, and the mapping is
empty otherwise: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, DCGM_FI_DEV_CLOCKS_EVENT_REASONS,
DCGM_FI_PROF_SM_ACTIVE/SM_OCCUPANCY/PIPE_FP*_ACTIVE (and NVLink bytes). What cannot be mapped
by a rename is written per source in the alert itself (alert_rules/gpu.py): XIDs (dcgm-exporter
exports the last XID as a gauge value, not a counter per XID) and staleness (dcgm-exporter has
no last-success timestamp; a GPU whose energy counter stops moving is frozen data).
"""

from __future__ import annotations

from alert_rules.config import ConfigError, Profile
from alert_rules.model import Group, Record
from alert_rules.promql import sel
from trainwatch.exporters.contract import catalog as c

TRAINWATCH, DCGM = "trainwatch", "dcgm"

# The labels dcgm-exporter puts on a GPU's series, from its metrics template
# (gpuMetricsFormat in internal/pkg/rendermetrics/render_metrics.go, NVIDIA/dcgm-exporter at
# 1f7abdb7dc0f): gpu, UUID, pci_bus_id, device, modelName, then Hostname (capital H: label
# names are case-sensitive, and only the NVLink template spells it `hostname`), then one label
# per `label` row of the counters file (DCGM_FI_DRIVER_VERSION is on by default).
# tests/rules/test_gpu_source.py feeds the promtool cases exactly this set.
DCGM_UUID, DCGM_MODEL, DCGM_HOSTNAME = "UUID", "modelName", "Hostname"
DCGM_GPU_LABELS = ("gpu", DCGM_UUID, "pci_bus_id", "device", DCGM_MODEL, DCGM_HOSTNAME)
# identity labels from the counters file's `label` rows: dropped, as Trainwatch's exporter puts
# no driver version on a GPU's series (a driver upgrade would otherwise start new series)
DCGM_DEFAULT_LABEL_FIELDS = ("DCGM_FI_DRIVER_VERSION",)
SOURCES = (TRAINWATCH, DCGM)


def _twin(name: str, which: int = 0) -> str:
    """The dcgm-exporter field the metric table names as `name`'s twin."""
    return c.METRICS[name].dcgm[which]


# dcgm-exporter counter names (etc/default-counters.csv unless marked "not default"), read
# from the metric table's dcgm column
GPU_TEMP = _twin(c.GPU_TEMPERATURE)
FB_USED = _twin(c.GPU_MEMORY_USED)
FB_FREE = _twin(c.GPU_MEMORY_FREE)
FB_RESERVED = _twin(c.GPU_MEMORY_RESERVED)
GPU_UTIL = _twin(c.GPU_UTILIZATION)
MEM_COPY_UTIL = _twin(c.GPU_MEMORY_UTILIZATION)
POWER_USAGE = _twin(c.GPU_POWER_USAGE)
ENERGY = _twin(c.GPU_ENERGY)
SM_CLOCK = _twin(c.GPU_SM_CLOCK)
MEM_CLOCK = _twin(c.GPU_MEMORY_CLOCK)
PCIE_REPLAY = _twin(c.GPU_PCIE_REPLAYS)
XID = _twin(c.GPU_XID_ERRORS)
ROW_REMAP_FAILURE = _twin(c.GPU_ROW_REMAP_FAILURE)
CORRECTABLE_REMAPPED_ROWS = _twin(c.GPU_REMAPPED_ROWS, 0)
UNCORRECTABLE_REMAPPED_ROWS = _twin(c.GPU_REMAPPED_ROWS, 1)
ECC_DBE_VOLATILE = _twin(c.GPU_ECC_ERRORS)  # not default
CLOCKS_EVENT_REASONS = _twin(c.GPU_CLOCK_EVENT_REASON)  # not default (a bitmask)

# DCGM fields mapped although dcgm-exporter's counters file does not list them at all
NOT_IN_COUNTERS_FILE = (CLOCKS_EVENT_REASONS, _twin(c.GPU_NVLINK_TX_RATE),
                        _twin(c.GPU_NVLINK_RX_RATE))
DEFAULT_COUNTERS = (GPU_TEMP, FB_USED, FB_FREE, FB_RESERVED, GPU_UTIL, MEM_COPY_UTIL,
                    POWER_USAGE, ENERGY, SM_CLOCK, MEM_CLOCK, PCIE_REPLAY, XID,
                    ROW_REMAP_FAILURE, CORRECTABLE_REMAPPED_ROWS, UNCORRECTABLE_REMAPPED_ROWS,
                    *(_twin(name) for name in (c.GPU_GRAPHICS_ENGINE_ACTIVE, c.GPU_TENSOR_ACTIVE,
                                               c.GPU_DRAM_ACTIVE, c.GPU_PCIE_TX_RATE,
                                               c.GPU_PCIE_RX_RATE)))


def _number(value: float) -> str:
    """A conversion factor as PromQL: whole numbers as digits, a million or more that is a
    power of ten as 1eN (1048576, 100, 1000, 1e6)."""
    if value != int(value):
        return repr(value)
    digits = str(int(value))
    if value >= 1e6 and digits.rstrip("0") == "1":
        return f"1e{len(digits) - 1}"
    return digits


def scaled(expr: str, name: str) -> str:
    """`expr`, in the unit of `name`'s dcgm fields, converted to the row's base unit by its
    `dcgm_scale` (a multiplication, or a division by the inverse of a scale below 1)."""
    scale = c.METRICS[name].dcgm_scale
    if scale == 1:
        return expr
    if scale > 1:
        return f"{expr} * {_number(scale)}"
    return f"{expr} / {_number(1 / scale)}"


def source(p: Profile) -> str:
    value = str(p.values.get("gpu_source", TRAINWATCH))
    if value not in SOURCES:
        raise ConfigError(f"gpu_source: {value!r} is not one of {list(SOURCES)}")
    return value


def dcgm_labels(expr: str) -> str:
    """dcgm-exporter's labels renamed to the exporter's: UUID -> uuid, modelName -> name;
    Hostname -> node only where Prometheus attached no node label (the same join trick as
    promql.with_node). The original labels are dropped so alerts carry one spelling: without a
    `node`, the host playbooks refuse the alert and the NodeDown inhibition misses it."""
    out = f'label_replace({expr}, "uuid", "$1", "{DCGM_UUID}", "(.+)")'
    out = f'label_replace({out}, "name", "$1", "{DCGM_MODEL}", "(.+)")'
    out = f'label_join({out}, "tw_node_source", ";", "node", "{DCGM_HOSTNAME}")'
    out = f'label_replace({out}, "node", "$1", "tw_node_source", ";(.+)")'
    for scratch in ("tw_node_source", DCGM_UUID, DCGM_MODEL, DCGM_HOSTNAME,
                    *DCGM_DEFAULT_LABEL_FIELDS):
        out = f'label_replace({out}, "{scratch}", "", "", "")'
    return out


def groups(p: Profile) -> list[Group]:
    """The mapping group for the dcgm source; nothing for Trainwatch's own exporter."""
    if source(p) != DCGM:
        return []
    g = p.selector("gpu")

    def d(name: str) -> str:
        return sel(name, g)

    def rec(name: str, expr: str, **labels: str) -> Record:
        return SourceRecord(name, dcgm_labels(expr), labels)

    rules = [
        rec(c.GPU_TEMPERATURE, d(GPU_TEMP)),
        rec(c.GPU_MEMORY_USED, scaled(d(FB_USED), c.GPU_MEMORY_USED)),
        rec(c.GPU_MEMORY_FREE, scaled(d(FB_FREE), c.GPU_MEMORY_FREE)),
        rec(c.GPU_MEMORY_RESERVED, scaled(d(FB_RESERVED), c.GPU_MEMORY_RESERVED)),
        # older dcgm-exporters have no FB_RESERVED: their used already includes it
        rec(c.GPU_MEMORY_TOTAL, scaled(f"({d(FB_USED)} + {d(FB_FREE)}\n"
                                       f"+ ({d(FB_RESERVED)} or {d(FB_USED)} * 0))",
                                       c.GPU_MEMORY_USED)),
        rec(c.GPU_UTILIZATION, scaled(d(GPU_UTIL), c.GPU_UTILIZATION)),
        rec(c.GPU_MEMORY_UTILIZATION, scaled(d(MEM_COPY_UTIL), c.GPU_MEMORY_UTILIZATION)),
        rec(c.GPU_POWER_USAGE, scaled(d(POWER_USAGE), c.GPU_POWER_USAGE)),
        rec(c.GPU_ENERGY, scaled(d(ENERGY), c.GPU_ENERGY)),
        rec(c.GPU_SM_CLOCK, scaled(d(SM_CLOCK), c.GPU_SM_CLOCK)),
        rec(c.GPU_MEMORY_CLOCK, scaled(d(MEM_CLOCK), c.GPU_MEMORY_CLOCK)),
        rec(c.GPU_PCIE_REPLAYS, d(PCIE_REPLAY)),
        rec(c.GPU_ROW_REMAP_FAILURE, d(ROW_REMAP_FAILURE)),
        rec(c.GPU_REMAPPED_ROWS, d(CORRECTABLE_REMAPPED_ROWS), cause="correctable"),
        rec(c.GPU_REMAPPED_ROWS, d(UNCORRECTABLE_REMAPPED_ROWS), cause="uncorrectable"),
        # Uncorrectable ECC: the DBE counter where enabled; else a new uncorrectable row
        # remap, which the driver performs for every uncorrectable HBM error (on by default).
        rec(c.GPU_ECC_ERRORS, f"{d(ECC_DBE_VOLATILE)}\nor\n{d(UNCORRECTABLE_REMAPPED_ROWS)}",
            error_type="uncorrected", counter="volatile"),
        rec(c.GPU_UP, _gpu_up(p)),
        rec(c.GPU_LOST, f"(({_gpu_up(p)}) == 0) + 1"),
        # identity (dcgm-exporter puts pci_bus_id on every series): the inventory panel
        rec(c.GPU_INFO, f"{d(GPU_TEMP)} * 0 + 1"),
    ]
    for label, bit in c.CLOCK_EVENT_REASONS:
        rules.append(rec(c.GPU_CLOCK_EVENT_REASON,
                         f"floor({d(CLOCKS_EVENT_REASONS)} / {bit}) % 2", reason=label))
    for row in c.metrics_of("gpu"):
        if row.gpm:  # the profiling fields
            rules.append(rec(row.name, scaled(d(_twin(row.name)), row.name)))
    return [Group("trainwatch-gpu-source.rules", rules)]


def _gpu_up(p: Profile) -> str:
    """1 while dcgm-exporter reports the GPU; 0 for `lost_window` after its series vanished
    from an exporter that is still up (dcgm-exporter drops a GPU that fell off the bus)."""
    g = p.selector("gpu")
    window = p.values["dcgm"]["lost_window"]
    temp = sel(GPU_TEMP, g)
    return (f"({temp} * 0 + 1)\nor\n"
            f"(max_over_time({temp}[{window}]) * 0\n"
            f" and on (job, instance) ({sel('up', g)} == 1))")


class SourceRecord(Record):
    """A mapping rule: records an exporter-level `trainwatch_gpu_*` name (no colons), so every
    rule and panel reads one spelling whatever the source; only the source group may."""

    def __post_init__(self) -> None:
        if not self.name.startswith(c.GPU_PREFIX):
            raise ValueError(f"source mapping {self.name!r} must record a trainwatch_gpu_ name")
