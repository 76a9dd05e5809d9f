"""A fake NVML for tests and `--simulate`: the pynvml API subset Trainwatch uses.

There is no GPU on CI machines or laptops, so this object stands in for the `pynvml` module.
It raises the REAL pynvml exception classes (NVMLError_NotSupported, NVMLError_GpuIsLost,
NVMLError_DriverNotLoaded, NVMLError_Timeout, ...), so the exporter's error handling is the
code that runs in production. Values use NVML's native units (mW, mJ, MHz, bytes, percent).

A scenario is a JSON-compatible dict (see `simulated_scenario` and docs/gpu_exporter.md):

    {"driver_version": "550.54.15", "cuda_version": 12040,
     "init_error": "DriverNotLoaded", "init_failures": 2,       # optional: fail nvmlInit
     "hang": ["nvmlDeviceGetPowerUsage"],                        # calls that block
     "xid_events": [{"gpu": 0, "xid": 79}],                      # delivered once each
     "memory_v2": true,                                          # false: driver < 510
     "latency_ms": {"nvmlGpmSampleGet": 2.8},                    # per-call sleep (benchmark)
     "gpus": [{"name": ..., "uuid": ..., "memory_total": ..., "memory_used": ...,
               "memory_reserved": ..., "not_supported": [...],
               "errors": {"nvmlDeviceGetUUID": "Unknown"}, "lost": false,
               "processes": [{"pid": 1234, "used_memory": 1073741824, "environ": {...}}],
               "mig": {"enabled": true, "devices": [{"uuid": ..., "memory_total": ...}]},
               "gpm": {"supported": true, "metrics": {"SM_UTIL": 62.27, ...}}, ...}]}

`TRAINWATCH_FAKE_NVML=/path/scenario.json` makes `load_nvml()` (exporters/node/gpu/nvml_source.py)
return a file-backed fake that re-reads the file when it changes and writes power-limit changes
back to it, so several processes (exporter, power-limit tool, remediation tests) share one
simulated machine.
"""

from __future__ import annotations

import copy
import json
import math
import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from trainwatch.exporters.contract import catalog
from trainwatch.exporters.node.gpu.config import ScenarioError

# The NVML calls the metric table names (Metric.nvml), by function name: the fake answers every
# one it has no code for with the scenario's gpus[i].nvml[call], else the row's `simulated`.
TABLE_CALLS = {row.nvml: row for row in reversed(catalog.metrics_of("gpu")) if row.nvml}
GIB = 1024**3
MIB = 1024**2
_TOP_KEYS = frozenset({"driver_version", "cuda_version", "init_error", "init_failures", "hang",
                       "xid_events", "gpus", "dynamic", "memory_v2", "latency_ms"})
_GPU_KEYS = frozenset({
    "name", "uuid", "pci_bus_id", "utilization_gpu", "utilization_memory", "memory_total",
    "memory_used", "memory_reserved", "temperature", "power_usage_mw", "power_limit_mw",
    "power_min_mw", "power_max_mw", "power_default_mw", "energy_mj", "sm_clock_mhz",
    "mem_clock_mhz", "clock_event_reasons", "ecc", "remapped_rows", "nvml", "nvlinks",
    "processes", "mig", "not_supported", "errors", "lost", "hang", "supports_events", "gpm",
})
# What one call cost on the H100 host (tests/gpu/fixtures/h100/measurements.md and
# gpm-during-bf16-matmul.txt), in ms. A scenario's "latency_ms" makes the fake sleep that long
# per call, so cycle times under the fake model the real driver's (benchmarks/gpu_exporter.py).
H100_CALL_LATENCY_MS: dict[str, float] = {
    "nvmlDeviceGetTotalEnergyConsumption": 3.1, "nvmlDeviceGetTotalEccErrors": 0.49,
    "nvmlDeviceGetCurrentClocksEventReasons": 0.39, "nvmlDeviceGetPcieReplayCounter": 0.34,
    "nvmlDeviceGetMigMode": 0.32, "nvmlDeviceGetComputeRunningProcesses": 0.27,
    "nvmlDeviceGetClockInfo": 0.11, "nvmlDeviceGetNvLinkState": 0.06,
    "nvmlDeviceGetPciInfo": 0.03, "nvmlDeviceGetRemappedRows": 0.03,
    # utilization + memory + temperature + power together: 0.016 ms
    "nvmlDeviceGetUtilizationRates": 0.004, "nvmlDeviceGetMemoryInfo_v2": 0.004,
    "nvmlDeviceGetTemperature": 0.004, "nvmlDeviceGetPowerUsage": 0.004,
    "nvmlGpmSampleGet": 2.806, "nvmlGpmMetricsGet": 4.798,
}
# GPM metric names a scenario may give values for (NVML's own names, NVML's units: percent,
# MiB/s), e.g. "gpm": {"supported": true, "metrics": {"SM_UTIL": 62.27}}. A metric the
# scenario leaves out answers NOT_SUPPORTED in its per-metric return code, as on real GPUs.
GPM_METRIC_IDS: dict[str, int] = {
    name.removeprefix("NVML_GPM_METRIC_"): value for name, value in vars(pynvml).items()
    if name.startswith("NVML_GPM_METRIC_") and name != "NVML_GPM_METRIC_MAX"}
# What GPM measured on the H100 during a bf16 matmul loop (tests/gpu/fixtures/h100/); the
# PCIe, NVLink, FP32 and FP64 figures are plausible values for a data-parallel job, not readings.
H100_GPM_DURING_MATMUL: dict[str, float] = {
    "GRAPHICS_UTIL": 67.46, "SM_UTIL": 62.27, "SM_OCCUPANCY": 9.21, "ANY_TENSOR_UTIL": 60.40,
    "DRAM_BW_UTIL": 16.41, "FP16_UTIL": 0.0, "FP32_UTIL": 2.5, "FP64_UTIL": 0.0,
    "PCIE_TX_PER_SEC": 150.0, "PCIE_RX_PER_SEC": 900.0,
    "NVLINK_TOTAL_TX_PER_SEC": 20480.0, "NVLINK_TOTAL_RX_PER_SEC": 20480.0,
}


def _error_class(name: str) -> type[pynvml.NVMLError]:
    cls = getattr(pynvml, f"NVMLError_{name}", None)
    if not (isinstance(cls, type) and issubclass(cls, pynvml.NVMLError)):
        raise ScenarioError(f"unknown NVML error name {name!r} (e.g. NotSupported, GpuIsLost)")
    return cls


def validate_scenario(scenario: Any) -> dict[str, Any]:
    """Reject unknown keys and wrong shapes with a message that says what to fix."""
    if not isinstance(scenario, dict):
        raise ScenarioError("scenario must be a JSON object")
    unknown = set(scenario) - _TOP_KEYS
    if unknown:
        raise ScenarioError(f"unknown scenario keys: {sorted(unknown)}")
    gpus = scenario.get("gpus", [])
    if not isinstance(gpus, list):
        raise ScenarioError("'gpus' must be a list")
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            raise ScenarioError(f"gpus[{i}] must be an object")
        unknown = set(gpu) - _GPU_KEYS
        if unknown:
            raise ScenarioError(f"gpus[{i}]: unknown keys {sorted(unknown)}")
        for name in gpu.get("errors", {}).values():
            _error_class(name)
        unknown = set(gpu.get("nvml", {})) - set(TABLE_CALLS)
        if unknown:
            raise ScenarioError(f"gpus[{i}].nvml: {sorted(unknown)} are not NVML calls of the "
                                f"metric table (exporters/contract/catalog.py, Metric.nvml)")
        gpm = gpu.get("gpm")
        if gpm is not None:
            if not isinstance(gpm, dict) or set(gpm) - {"supported", "metrics"}:
                raise ScenarioError(f"gpus[{i}].gpm must be {{'supported': bool, 'metrics': {{}}}}")
            unknown = set(gpm.get("metrics", {})) - set(GPM_METRIC_IDS)
            if unknown:
                raise ScenarioError(f"gpus[{i}].gpm.metrics: unknown GPM metrics "
                                    f"{sorted(unknown)} (NVML names, e.g. SM_UTIL)")
    if scenario.get("init_error"):
        _error_class(scenario["init_error"])
    return scenario


def simulated_gpu(index: int) -> dict[str, Any]:
    """A plausible H100 SXM with NVLink, ECC and one attributed training process."""
    return {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-5a1e0000-0000-4000-8000-{index:012d}",
        "pci_bus_id": f"00000000:{0x18 + index * 0x10:02X}:00.0",
        "utilization_gpu": 90 - index, "utilization_memory": 40 + index,
        # reserved: what driver 580 keeps on an 80 GB H100 (tests/gpu/fixtures/h100/)
        "memory_total": 80 * GIB, "memory_used": (60 + index) * GIB,
        "memory_reserved": 480 * MIB,
        "temperature": 55 + index, "power_usage_mw": 500_000 + index * 1000,
        "power_limit_mw": 700_000, "power_min_mw": 200_000, "power_max_mw": 700_000,
        "power_default_mw": 700_000, "energy_mj": 1_000_000_000 + index,
        "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "clock_event_reasons": 0,
        "ecc": {"corrected_volatile": 0, "corrected_aggregate": 2,
                "uncorrected_volatile": 0, "uncorrected_aggregate": 0},
        "remapped_rows": [0, 0, 0, 0],
        "nvlinks": [{"state": 1, "replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
                    for _ in range(2)],
        "processes": [{"pid": 4_000_000 + index, "used_memory": (58 + index) * GIB,
                       "environ": {"TRAINWATCH_JOB": "demo-llm", "RANK": str(index)}}],
        "mig": {"enabled": False, "devices": []},
        "gpm": {"supported": True, "metrics": dict(H100_GPM_DURING_MATMUL)},
    }


def simulated_scenario(gpus: int, dynamic: bool = True) -> dict[str, Any]:
    """`--simulate N`: N GPUs; `dynamic` makes utilization/power/temperature drift over time."""
    return {"driver_version": "550.54.15", "cuda_version": 12040, "dynamic": dynamic,
            "gpus": [simulated_gpu(i) for i in range(gpus)]}


@dataclass(frozen=True)
class FakeHandle:
    index: int
    mig: int | None = None


class FakeGpmSample:
    """A GPM sample buffer: which GPU it was taken on and when (None: never taken)."""

    def __init__(self) -> None:
        self.gpu: int | None = None
        self.taken: float | None = None
        self.freed = False


class FakeGpmMetricsGet:
    """Stands in for pynvml.c_nvmlGpmMetricsGet_t (same field names; a list, not ctypes)."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: FakeGpmSample | None = None
        self.sample2: FakeGpmSample | None = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)
                        for _ in range(64)]


class FakeNvml:
    """Stands in for the pynvml module. Thread-safe; tests change the scenario with `update`."""

    def __init__(self, scenario: dict[str, Any], path: Path | None = None) -> None:
        self._lock = threading.RLock()
        self._scenario = validate_scenario(copy.deepcopy(scenario))
        self._path = path
        self._mtime: int | None = None
        self._initialised = False
        self._init_attempts = 0
        self._delivered_xids = 0
        self._events: queue.Queue[SimpleNamespace] = queue.Queue()
        self._started = time.monotonic()
        self.calls = 0

    # --- scenario control ------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> FakeNvml:
        path = Path(path)
        fake = cls(_read_json(path), path)
        fake._mtime = path.stat().st_mtime_ns
        return fake

    def update(self, mutate: Any) -> None:
        """Apply `mutate(scenario_dict)` atomically (tests: lose a GPU, add a process...)."""
        with self._lock:
            mutate(self._scenario)
            validate_scenario(self._scenario)

    def scenario(self) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._scenario)

    def inject_xid(self, gpu: int, xid: int) -> None:
        self._events.put(SimpleNamespace(device=FakeHandle(gpu),
                                         eventType=pynvml.nvmlEventTypeXidCriticalError,
                                         eventData=xid, gpuInstanceId=0, computeInstanceId=0))

    @property
    def init_attempts(self) -> int:
        return self._init_attempts

    def unload_driver(self) -> None:
        """The driver goes away under a running process: every call is Uninitialized until
        the next successful nvmlInit (combine with `init_error` to keep init failing)."""
        with self._lock:
            self._initialised = False

    def _reload_if_changed(self) -> None:
        if self._path is None:
            return
        try:
            mtime = self._path.stat().st_mtime_ns
            if mtime == self._mtime:
                return
            scenario = validate_scenario(_read_json(self._path))
        except (OSError, ValueError):
            return  # keep the last good scenario while a writer is half-way
        with self._lock:
            self._scenario, self._mtime = scenario, mtime

    def _persist(self) -> None:
        if self._path is None:
            return
        with self._lock:
            data = json.dumps(self._scenario, indent=2, sort_keys=True)
            fd, tmp = tempfile.mkstemp(dir=self._path.parent, prefix=".fake-nvml-")
            with os.fdopen(fd, "w") as handle:
                handle.write(data)
            os.replace(tmp, self._path)
            self._mtime = self._path.stat().st_mtime_ns

    # --- the gate every call passes --------------------------------------------------------
    def _enter(self, fn: str, handle: FakeHandle | None = None) -> dict[str, Any] | None:
        self.calls += 1
        self._wait_while_hung(fn, handle)
        latency = self._scenario.get("latency_ms")
        if latency and fn in latency:
            time.sleep(latency[fn] / 1000)  # the driver's time, not the CPU's
        with self._lock:
            if not self._initialised:
                raise pynvml.NVMLError_Uninitialized()
            if handle is None:
                return None
            gpus = self._scenario.get("gpus", [])
            if not 0 <= handle.index < len(gpus):
                raise pynvml.NVMLError_InvalidArgument()
            gpu = gpus[handle.index]
            if gpu.get("lost"):
                raise pynvml.NVMLError_GpuIsLost()
            error = gpu.get("errors", {}).get(fn)
            if error:
                raise _error_class(error)()
            if fn in gpu.get("not_supported", ()):
                raise pynvml.NVMLError_NotSupported()
            return gpu

    def _wait_while_hung(self, fn: str, handle: FakeHandle | None) -> None:
        while True:
            self._reload_if_changed()
            with self._lock:
                hung = fn in self._scenario.get("hang", ())
                if handle is not None and not hung:
                    gpus = self._scenario.get("gpus", [])
                    if 0 <= handle.index < len(gpus):
                        hung = fn in gpus[handle.index].get("hang", ())
            if not hung:
                return
            time.sleep(0.02)

    def _wiggle(self, base: float, amplitude: float, period: float, phase: int) -> float:
        if not self._scenario.get("dynamic"):
            return base
        t = time.monotonic() - self._started
        return base + amplitude * math.sin(2 * math.pi * t / period + phase)

    # --- system ----------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._reload_if_changed()
        with self._lock:
            self._init_attempts += 1
            error = self._scenario.get("init_error")
            failures = self._scenario.get("init_failures", -1)
            if error and (failures < 0 or self._init_attempts <= failures):
                raise _error_class(error)()
            self._initialised = True

    def nvmlShutdown(self) -> None:
        with self._lock:
            if not self._initialised:
                raise pynvml.NVMLError_Uninitialized()
            self._initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return str(self._scenario.get("driver_version", "550.54.15"))

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return int(self._scenario.get("cuda_version", 12040))

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._scenario.get("gpus", []))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        handle = FakeHandle(int(index))
        self._enter("nvmlDeviceGetHandleByIndex", handle)
        return handle

    # --- identity ----------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, h: FakeHandle) -> str:
        gpu = self._enter("nvmlDeviceGetUUID", h)
        if h.mig is not None:
            return str(gpu["mig"]["devices"][h.mig]["uuid"])
        return str(gpu.get("uuid", f"GPU-fake-{h.index}"))

    def nvmlDeviceGetName(self, h: FakeHandle) -> str:
        return str(self._enter("nvmlDeviceGetName", h).get("name", "Fake GPU"))

    def nvmlDeviceGetPciInfo(self, h: FakeHandle) -> SimpleNamespace:
        gpu = self._enter("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=gpu.get("pci_bus_id", f"00000000:{h.index:02X}:00.0"))

    # --- values ------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: FakeHandle) -> SimpleNamespace:
        gpu = self._enter("nvmlDeviceGetUtilizationRates", h)
        util = self._wiggle(gpu.get("utilization_gpu", 0), 8, 30, h.index)
        return SimpleNamespace(gpu=int(min(max(util, 0), 100)),
                               memory=int(gpu.get("utilization_memory", 0)))

    def nvmlDeviceGetMemoryInfo(self, h: FakeHandle, version: int | None = None
                                ) -> SimpleNamespace:
        """Like the driver: v1's `used` includes the reservation; v2 reports it apart.

        A scenario with `"memory_v2": false` is a driver before 510, which lacks the
        `nvmlDeviceGetMemoryInfo_v2` symbol (pynvml raises FunctionNotFound).
        """
        if version:
            if not self._scenario.get("memory_v2", True):
                self._enter("nvmlDeviceGetMemoryInfo_v2")
                raise pynvml.NVMLError_FunctionNotFound()
            if version != pynvml.nvmlMemory_v2:
                raise pynvml.NVMLError_ArgumentVersionMismatch()
        gpu = self._enter("nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo",
                          h)
        source = gpu["mig"]["devices"][h.mig] if h.mig is not None else gpu
        total = int(source.get("memory_total", 80 * GIB))
        used = int(source.get("memory_used", 0))
        reserved = int(source.get("memory_reserved", 0))
        free = total - used - reserved
        if version:
            return SimpleNamespace(version=version, total=total, reserved=reserved, free=free,
                                   used=used)
        return SimpleNamespace(total=total, used=used + reserved, free=free)

    def nvmlDeviceGetTemperature(self, h: FakeHandle, sensor: int) -> int:
        gpu = self._enter("nvmlDeviceGetTemperature", h)
        return int(self._wiggle(gpu.get("temperature", 40), 3, 60, h.index))

    def nvmlDeviceGetPowerUsage(self, h: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetPowerUsage", h)
        usage = self._wiggle(gpu.get("power_usage_mw", 100_000), 40_000, 30, h.index)
        return int(min(usage, gpu.get("power_limit_mw", usage)))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeHandle) -> int:
        return int(self._enter("nvmlDeviceGetEnforcedPowerLimit", h).get("power_limit_mw", 0))

    def nvmlDeviceGetPowerManagementLimit(self, h: FakeHandle) -> int:
        return int(self._enter("nvmlDeviceGetPowerManagementLimit", h).get("power_limit_mw", 0))

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: FakeHandle) -> list[int]:
        gpu = self._enter("nvmlDeviceGetPowerManagementLimitConstraints", h)
        return [int(gpu.get("power_min_mw", 0)), int(gpu.get("power_max_mw", 0))]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetPowerManagementDefaultLimit", h)
        return int(gpu.get("power_default_mw", 0))

    def nvmlDeviceSetPowerManagementLimit(self, h: FakeHandle, limit: int) -> None:
        """Like the driver: out-of-range values are InvalidArgument; the change persists."""
        with self._lock:
            gpu = self._enter("nvmlDeviceSetPowerManagementLimit", h)
            if not gpu.get("power_min_mw", 0) <= int(limit) <= gpu.get("power_max_mw", 0):
                raise pynvml.NVMLError_InvalidArgument()
            gpu["power_limit_mw"] = int(limit)
            self._persist()

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetTotalEnergyConsumption", h)
        energy = int(gpu.get("energy_mj", 0))
        if self._scenario.get("dynamic"):
            energy += int((time.monotonic() - self._started) * gpu.get("power_usage_mw", 0))
        return energy

    def nvmlDeviceGetClockInfo(self, h: FakeHandle, clock: int) -> int:
        gpu = self._enter("nvmlDeviceGetClockInfo", h)
        key = "sm_clock_mhz" if clock == pynvml.NVML_CLOCK_SM else "mem_clock_mhz"
        return int(gpu.get(key, 0))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return int(gpu.get("clock_event_reasons", 0))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeHandle) -> int:
        gpu = self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return int(gpu.get("clock_event_reasons", 0))

    def nvmlDeviceGetTotalEccErrors(self, h: FakeHandle, error_type: int, counter: int) -> int:
        gpu = self._enter("nvmlDeviceGetTotalEccErrors", h)
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        kind = "corrected" if corrected else "uncorrected"
        which = "volatile" if counter == pynvml.NVML_VOLATILE_ECC else "aggregate"
        return int(gpu.get("ecc", {}).get(f"{kind}_{which}", 0))

    def nvmlDeviceGetRemappedRows(self, h: FakeHandle) -> tuple[int, int, int, int]:
        rows = self._enter("nvmlDeviceGetRemappedRows", h).get("remapped_rows", [0, 0, 0, 0])
        return (int(rows[0]), int(rows[1]), int(rows[2]), int(rows[3]))

    def __getattr__(self, name: str) -> Any:
        """A device call the metric table names and this class has no code for: the
        scenario's gpus[i].nvml[name], else the row's simulated value (NVML's units; a
        mapping answers as an object with those attributes, like pynvml's structs)."""
        row = TABLE_CALLS.get(name)
        if row is None:
            raise AttributeError(name)

        def getter(h: FakeHandle, *args: Any) -> Any:
            return _as_nvml(self._enter(name, h).get("nvml", {}).get(name, row.simulated))
        setattr(self, name, getter)  # found directly from now on: no lookup per call
        return getter

    def _link(self, fn: str, h: FakeHandle, link: int) -> dict[str, Any]:
        links = self._enter(fn, h).get("nvlinks")
        if links is None:
            raise pynvml.NVMLError_NotSupported()
        if not 0 <= link < len(links):
            raise pynvml.NVMLError_InvalidArgument()
        return links[link]

    def nvmlDeviceGetNvLinkState(self, h: FakeHandle, link: int) -> int:
        return int(self._link("nvmlDeviceGetNvLinkState", h, link).get("state", 1))

    def nvmlDeviceGetNvLinkErrorCounter(self, h: FakeHandle, link: int, counter: int) -> int:
        names = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
                 pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
                 pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
                 pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data"}
        return int(self._link("nvmlDeviceGetNvLinkErrorCounter", h, link).get(names[counter], 0))

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeHandle) -> list[SimpleNamespace]:
        gpu = self._enter("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=int(p["pid"]), usedGpuMemory=p.get("used_memory"))
                for p in gpu.get("processes", [])]

    def nvmlDeviceGetMigMode(self, h: FakeHandle) -> list[int]:
        mig = self._enter("nvmlDeviceGetMigMode", h).get("mig")
        if mig is None:
            raise pynvml.NVMLError_NotSupported()
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if mig.get("enabled") else 0
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeHandle, index: int) -> FakeHandle:
        gpu = self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if not 0 <= index < len(gpu.get("mig", {}).get("devices", [])):
            raise pynvml.NVMLError_NotFound()
        return FakeHandle(h.index, int(index))

    # --- GPM (profiling metrics) ----------------------------------------------------------------
    c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet

    def nvmlGpmQueryDeviceSupport(self, h: FakeHandle) -> SimpleNamespace:
        """No `gpm` key: a GPU before Hopper (the call succeeds and says unsupported)."""
        gpu = self._enter("nvmlGpmQueryDeviceSupport", h)
        gpm = gpu.get("gpm") or {}
        return SimpleNamespace(version=pynvml.NVML_GPM_SUPPORT_VERSION,
                               isSupportedDevice=1 if gpm.get("supported") else 0)

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        self._enter("nvmlGpmSampleAlloc")
        return FakeGpmSample()

    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:
        sample.freed = True

    def nvmlGpmSampleGet(self, h: FakeHandle, sample: FakeGpmSample) -> FakeGpmSample:
        gpu = self._enter("nvmlGpmSampleGet", h)
        if not (gpu.get("gpm") or {}).get("supported") or sample.freed:
            raise pynvml.NVMLError_NotSupported() if not sample.freed else (
                pynvml.NVMLError_InvalidArgument())
        sample.gpu, sample.taken = h.index, time.monotonic()
        return sample

    def nvmlGpmMetricsGet(self, request: FakeGpmMetricsGet) -> FakeGpmMetricsGet:
        """Like the driver: two samples of one GPU, the second one newer."""
        first, second = request.sample1, request.sample2
        if (first is None or second is None or first.taken is None or second.taken is None
                or first.gpu != second.gpu or second.taken <= first.taken
                or request.version != pynvml.NVML_GPM_METRICS_GET_VERSION):
            self._enter("nvmlGpmMetricsGet")
            raise pynvml.NVMLError_InvalidArgument()
        gpu = self._enter("nvmlGpmMetricsGet", FakeHandle(int(first.gpu or 0)))
        values = (gpu.get("gpm") or {}).get("metrics", {})
        by_id = {GPM_METRIC_IDS[name]: float(v) for name, v in values.items()}
        for metric in request.metrics[:request.numMetrics]:
            if metric.metricId in by_id:
                value = by_id[metric.metricId]
                if metric.metricId == pynvml.NVML_GPM_METRIC_SM_UTIL:
                    value = min(max(self._wiggle(value, 5, 30, int(first.gpu or 0)), 0), 100)
                metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, value
            else:
                metric.nvmlReturn, metric.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
        return request

    # --- events ------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, h: FakeHandle, event_types: int, event_set: object) -> None:
        gpu = self._enter("nvmlDeviceRegisterEvents", h)
        if not gpu.get("supports_events", True):
            raise pynvml.NVMLError_NotSupported()

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait")
        self._queue_scenario_xids()
        try:
            return self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None

    def nvmlEventSetFree(self, event_set: object) -> None:
        return None

    def _queue_scenario_xids(self) -> None:
        with self._lock:
            events = self._scenario.get("xid_events", [])
            for event in events[self._delivered_xids:]:
                self.inject_xid(int(event["gpu"]), int(event["xid"]))
            self._delivered_xids = max(self._delivered_xids, len(events))

    # --- fake-only helpers (not NVML) ----------------------------------------------------------
    def process_environ(self, pid: int) -> dict[str, str] | None:
        """The `environ` a scenario gives a simulated process (None: not simulated)."""
        with self._lock:
            for gpu in self._scenario.get("gpus", []):
                for proc in gpu.get("processes", []):
                    if proc.get("pid") == pid and "environ" in proc:
                        return dict(proc["environ"])
        return None


def _as_nvml(value: Any) -> Any:
    """JSON as pynvml returns it: objects for mappings (structs), lists of them, numbers."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _as_nvml(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_as_nvml(v) for v in value]
    return value


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path}: not valid JSON: {exc}") from exc


