"""One NVML collection cycle: read every GPU into an immutable `GpuSnapshot`.

Error policy (README, "Exporters degrade, they do not die"):
- NotSupported / FunctionNotFound: the series is absent (not 0, not NaN), not an error.
- GpuIsLost, or any error getting the handle: that GPU is reported down; the others go on.
- Uninitialized / DriverNotLoaded / LibraryNotFound: NVML itself is gone; the cycle stops
  and the loop re-initialises with backoff (`NvmlGone`).
- Anything else: counted in errors_total{call, error}; the series is absent this cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.node.gpu.gpm import GpmReader
from trainwatch.exporters.node.gpu.processes import ProcessAttributor
from trainwatch.exporters.node.gpu.snapshot import GpuIdentity, GpuSnapshot, Labels, Sample, Tally

ABSENT_ERRORS = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)
LOST_ERRORS = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_ResetRequired)
# The driver has no v2 memory info: use v1 from then on.
V1_ONLY_ERRORS = (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_ArgumentVersionMismatch)
GONE_ERRORS = (
    pynvml.NVMLError_Uninitialized,
    pynvml.NVMLError_DriverNotLoaded,
    pynvml.NVMLError_LibraryNotFound,
)

ECC_KINDS = (
    ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
    ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
)
ECC_COUNTERS = (("volatile", pynvml.NVML_VOLATILE_ECC), ("aggregate", pynvml.NVML_AGGREGATE_ECC))
NVLINK_COUNTERS = (
    ("replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
    ("crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
)


# Rows of the metric table read by one plain NVML getter each (catalog.Metric.nvml).
PLAIN_GETTERS = tuple(row for row in c.metrics_of("gpu") if row.nvml and row.scale is not None)
POWER_READINGS = (
    (c.GPU_POWER_USAGE, "nvmlDeviceGetPowerUsage"),
    (c.GPU_POWER_LIMIT, "nvmlDeviceGetEnforcedPowerLimit"),
    (c.GPU_POWER_LIMIT_DEFAULT, "nvmlDeviceGetPowerManagementDefaultLimit"),
)


class NvmlGone(Exception):
    """NVML stopped working as a whole (driver unloaded); the loop must re-initialise."""


class GpuLost(Exception):
    """This GPU stopped answering; report it down and move on to the next one."""


def error_name(exc: BaseException) -> str:
    """'NVMLError_NoPermission' -> 'NoPermission': a bounded label value."""
    return type(exc).__name__.removeprefix("NVMLError_")[:40]


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def cuda_version_text(version: int) -> str:
    """NVML reports CUDA 12.4 as 12040."""
    return f"{version // 1000}.{(version % 1000) // 10}"


class DeviceReader:
    """Reads GPUs through an NVML-like object (pynvml, or fake_nvml.py's fake)."""

    def __init__(self, nvml: Any, errors: Tally, attributor: ProcessAttributor | None,
                 read_nvlink: bool = True, read_gpm: bool = True) -> None:
        self.nvml = nvml
        self.errors = errors
        self.attributor = attributor
        self.read_nvlink = read_nvlink
        self.gpm = GpmReader(nvml, self.call) if read_gpm else None
        # the GPU being read: its index, and whether MIG is on (set by _mig, read by _gpm)
        self._index, self._mig_enabled = 0, False
        self.memory_v2 = True  # until the driver says it has only v1 (a driver-wide fact)
        self.identities: dict[int, GpuIdentity] = {}
        # a getter this pynvml lacks (an older pynvml) leaves its series absent
        self.plain_getters = tuple(row for row in PLAIN_GETTERS if hasattr(nvml, row.nvml))

    def call(self, fn_name: str, *args: Any) -> Any:
        """Call NVML; None means 'absent this cycle'. Lost / gone errors propagate."""
        try:
            return getattr(self.nvml, fn_name)(*args)
        except ABSENT_ERRORS:
            return None
        except pynvml.NVMLError as exc:
            self._failed(fn_name, exc)
            return None

    def _failed(self, fn_name: str, exc: pynvml.NVMLError, counted_as: str = "") -> None:
        """An NVML error its caller has no special meaning for: a lost GPU (GpuLost) or a
        gone NVML (NvmlGone) propagates, anything else is counted (as `counted_as`, default
        `fn_name`) and the reading is absent this cycle. One place, so every call agrees."""
        if isinstance(exc, LOST_ERRORS):
            raise GpuLost(fn_name) from exc
        if isinstance(exc, GONE_ERRORS):
            raise NvmlGone(fn_name) from exc
        self.errors.inc((counted_as or fn_name, error_name(exc)))

    # --- one cycle ------------------------------------------------------------------------
    def read_all(self) -> tuple[GpuSnapshot, ...]:
        try:
            count = self.nvml.nvmlDeviceGetCount()
        except GONE_ERRORS as exc:
            raise NvmlGone("nvmlDeviceGetCount") from exc
        except pynvml.NVMLError as exc:
            self.errors.inc(("nvmlDeviceGetCount", error_name(exc)))
            raise NvmlGone("nvmlDeviceGetCount") from exc
        gpus = []
        seen_pids: set[int] = set()
        if self.gpm is not None:
            self.gpm.cycle_seconds = 0.0
        for index in range(count):
            gpus.append(self.read_gpu(index, seen_pids))
        if self.attributor is not None:
            self.attributor.retain(seen_pids)
        return tuple(gpus)

    def known_down(self) -> tuple[GpuSnapshot, ...]:
        """Every GPU seen before, reported down: what we say while NVML itself is gone."""
        return tuple(GpuSnapshot(identity, up=False) for _, identity in
                     sorted(self.identities.items()))

    def read_gpu(self, index: int, seen_pids: set[int]) -> GpuSnapshot:
        fallback = self.identities.get(index, GpuIdentity(index, "", ""))
        try:
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        except GONE_ERRORS as exc:
            raise NvmlGone("nvmlDeviceGetHandleByIndex") from exc
        except pynvml.NVMLError as exc:
            self.errors.inc(("nvmlDeviceGetHandleByIndex", error_name(exc)))
            return GpuSnapshot(fallback, up=False)
        try:
            identity = self.identities.get(index) or self._identify(index, handle)
            samples: list[Sample] = []
            self._index, self._mig_enabled = index, False
            for part in self._parts():
                part(handle, samples.append, seen_pids)
        except GpuLost as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            self.errors.inc((str(exc), error_name(cause)))
            return GpuSnapshot(self.identities.get(index, fallback), up=False)
        return GpuSnapshot(identity, up=True, samples=tuple(samples))

    def _identify(self, index: int, handle: Any) -> GpuIdentity:
        uuid = self.call("nvmlDeviceGetUUID", handle)
        name = self.call("nvmlDeviceGetName", handle)
        identity = GpuIdentity(index, text(uuid) if uuid else "", text(name) if name else "")
        if uuid:  # only remember a complete identity
            self.identities[index] = identity
        return identity

    def _parts(self) -> tuple[Callable[..., None], ...]:
        parts = [self._info, self._utilization, self._memory, self._thermal_power, self._clocks,
                 self._ecc, self._plain, self._mig]
        if self.read_nvlink:
            parts.append(self._nvlink)
        if self.attributor is not None:
            parts.append(self._processes)
        if self.gpm is not None:
            parts.append(self._gpm)  # after _mig, which tells whether MIG is enabled
        return tuple(parts)

    # --- field groups: each appends Samples for what the GPU supports ----------------------
    def _info(self, h: Any, emit: Callable[[Sample], None], _: set[int]) -> None:
        pci = self.call("nvmlDeviceGetPciInfo", h)
        bus_id = text(pci.busId) if pci is not None else ""
        emit(Sample(c.GPU_INFO, 1.0, (("pci_bus_id", bus_id),)))

    def _utilization(self, h: Any, emit: Callable[[Sample], None], _: set[int]) -> None:
        util = self.call("nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            emit(Sample(c.GPU_UTILIZATION, util.gpu / 100.0))
            emit(Sample(c.GPU_MEMORY_UTILIZATION, util.memory / 100.0))

    def _memory(self, h: Any, emit: Callable[[Sample], None], _: set[int]) -> None:
        """v2 first: its `used` excludes the driver's reservation, as nvidia-smi shows it.

        v1's `used` includes the reservation (480 MiB on an idle H100 with driver 580), so a
        v1 reading disagrees with nvidia-smi. A driver without v2 (before 510) answers
        FunctionNotFound or ArgumentVersionMismatch; it is asked for v1 from then on.
        """
        mem = None
        if self.memory_v2:
            try:
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            except V1_ONLY_ERRORS:
                self.memory_v2 = False
            except pynvml.NVMLError_NotSupported:
                pass  # this device only: ask v1
            except pynvml.NVMLError as exc:
                self._failed("nvmlDeviceGetMemoryInfo", exc, "nvmlDeviceGetMemoryInfo_v2")
                return
        if mem is None:
            mem = self.call("nvmlDeviceGetMemoryInfo", h)
        if mem is None:
            return
        emit(Sample(c.GPU_MEMORY_USED, float(mem.used)))
        emit(Sample(c.GPU_MEMORY_FREE, float(mem.free)))
        emit(Sample(c.GPU_MEMORY_TOTAL, float(mem.total)))
        reserved = getattr(mem, "reserved", None)
        if reserved is not None:
            emit(Sample(c.GPU_MEMORY_RESERVED, float(reserved)))

    def _thermal_power(self, h: Any, emit: Callable[[Sample], None], _: set[int]) -> None:
        temp = self.call("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
        if temp is not None:
            emit(Sample(c.GPU_TEMPERATURE, float(temp)))
        for metric, fn_name in POWER_READINGS:
            milliwatts = self.call(fn_name, h)
            if milliwatts is not None:
                emit(Sample(metric, milliwatts * c.MILLI))
        limits = self.call("nvmlDeviceGetPowerManagementLimitConstraints", h)
        if limits is not None:
            emit(Sample(c.GPU_POWER_LIMIT_MIN, limits[0] * c.MILLI))
            emit(Sample(c.GPU_POWER_LIMIT_MAX, limits[1] * c.MILLI))
        millijoules = self.call("nvmlDeviceGetTotalEnergyConsumption", h)
        if millijoules is not None:
            emit(Sample(c.GPU_ENERGY, millijoules * c.MILLI))

    def _clocks(self, h: Any, emit: Callable[[Sample], None], _: set[int]) -> None:
        for metric, clock in ((c.GPU_SM_CLOCK, pynvml.NVML_CLOCK_SM),
                              (c.GPU_MEMORY_CLOCK, pynvml.NVML_CLOCK_MEM)):
            mhz = self.call("nvmlDeviceGetClockInfo", h, clock)
            if mhz is not None:
                emit(Sample(metric, mhz * c.MEGA))
        reasons = self.call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:  # drivers before 535 only have the older name
            reasons = self.call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if reasons is not None:
            for label, bit in c.CLOCK_EVENT_REASONS:
                emit(Sample(c.GPU_CLOCK_EVENT_REASON, 1.0 if reasons & bit else 0.0,
                            (("reason", label),)))

    def _ecc(self, h: Any, emit: Callable[[Sample], None], _: set[int]) -> None:
        for kind, error_type in ECC_KINDS:
            for counter, counter_type in ECC_COUNTERS:
                count = self.call("nvmlDeviceGetTotalEccErrors", h, error_type, counter_type)
                if count is not None:
                    emit(Sample(c.GPU_ECC_ERRORS, float(count),
                                (("error_type", kind), ("counter", counter))))
        rows = self.call("nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            correctable, uncorrectable, pending, failure = rows
            emit(Sample(c.GPU_REMAPPED_ROWS, float(correctable), (("cause", "correctable"),)))
            emit(Sample(c.GPU_REMAPPED_ROWS, float(uncorrectable), (("cause", "uncorrectable"),)))
            emit(Sample(c.GPU_ROW_REMAP_PENDING, 1.0 if pending else 0.0))
            emit(Sample(c.GPU_ROW_REMAP_FAILURE, 1.0 if failure else 0.0))

    def _plain(self, h: Any, emit: Callable[[Sample], None], _: set[int]) -> None:
        """The metric table's plain-getter rows: one NVML call each, scaled, no code of their
        own."""
        for row in self.plain_getters:
            value = self.call(row.nvml, h)
            if value is not None:
                emit(Sample(row.name, float(value) * (row.scale or 1.0)))

    def _nvlink(self, h: Any, emit: Callable[[Sample], None], _: set[int]) -> None:
        """Links are numbered from 0; the first link NVML refuses ends the list."""
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = self.nvml.nvmlDeviceGetNvLinkState(h, link)
            except (*ABSENT_ERRORS, pynvml.NVMLError_InvalidArgument):
                return
            except pynvml.NVMLError as exc:
                self._failed("nvmlDeviceGetNvLinkState", exc)
                return
            link_label = (("link", str(link)),)
            emit(Sample(c.GPU_NVLINK_UP, 1.0 if state == pynvml.NVML_FEATURE_ENABLED else 0.0,
                        link_label))
            for counter, counter_id in NVLINK_COUNTERS:
                value = self.call("nvmlDeviceGetNvLinkErrorCounter", h, link, counter_id)
                if value is not None:
                    emit(Sample(c.GPU_NVLINK_ERRORS, float(value),
                                (*link_label, ("counter", counter))))

    def _processes(self, h: Any, emit: Callable[[Sample], None], seen_pids: set[int]) -> None:
        procs = self.call("nvmlDeviceGetComputeRunningProcesses", h)
        if procs is None or self.attributor is None:
            return
        by_owner: dict[Labels, float] = {}
        for proc in procs:
            pid = int(proc.pid)
            seen_pids.add(pid)
            job, rank = self.attributor.attribute(pid)
            key: Labels = (("training_job", job), ("rank", rank))
            used = proc.usedGpuMemory or 0  # None: not available (WDDM, some MIG setups)
            by_owner[key] = by_owner.get(key, 0.0) + float(used)
        emit(Sample(c.GPU_PROCESSES, float(len(procs))))
        for key, used in sorted(by_owner.items()):
            emit(Sample(c.GPU_PROCESS_MEMORY, used, key))

    def _mig(self, h: Any, emit: Callable[[Sample], None], _: set[int]) -> None:
        mode = self.call("nvmlDeviceGetMigMode", h)
        if mode is None:
            return
        enabled = mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        self._mig_enabled = enabled
        emit(Sample(c.GPU_MIG_ENABLED, 1.0 if enabled else 0.0))
        if not enabled:
            return
        slots = self.call("nvmlDeviceGetMaxMigDeviceCount", h) or 0
        for slot in range(int(slots)):
            try:
                mig = self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
            except pynvml.NVMLError_NotFound:
                continue  # an empty slot
            except LOST_ERRORS as exc:
                raise GpuLost("nvmlDeviceGetMigDeviceHandleByIndex") from exc
            except pynvml.NVMLError as exc:
                self.errors.inc(("nvmlDeviceGetMigDeviceHandleByIndex", error_name(exc)))
                continue
            mig_uuid = self.call("nvmlDeviceGetUUID", mig)
            mem = self.call("nvmlDeviceGetMemoryInfo", mig)
            if mem is None:
                continue
            labels = (("mig_index", str(slot)), ("mig_uuid", text(mig_uuid or "")))
            emit(Sample(c.GPU_MIG_MEMORY_USED, float(mem.used), labels))
            emit(Sample(c.GPU_MIG_MEMORY_TOTAL, float(mem.total), labels))

    def _gpm(self, h: Any, emit: Callable[[Sample], None], _: set[int]) -> None:
        if self.gpm is not None:
            self.gpm.read(self._index, h, self._mig_enabled, emit)
