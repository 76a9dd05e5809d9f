"""Profiling metrics through NVML GPM (GPU Performance Monitoring; Hopper and newer).

"GPU utilization" only says that some kernel was running: on an H100 running a bf16 matmul
loop it read 100% while GPM measured SM activity 62%, tensor-pipe activity 60% and DRAM
bandwidth 16% (tests/gpu/fixtures/h100/gpm-during-bf16-matmul.txt). These are the figures
dcgm-exporter users watch as `DCGM_FI_PROF_*`; NVML offers them without DCGM.

How it is read: each GPU keeps two GPM sample buffers. Every collection cycle takes one sample
(`nvmlGpmSampleGet`, ~3 ms on the H100) and computes the metrics between it and the previous
cycle's sample (`nvmlGpmMetricsGet`, ~5 ms), so the values are averages over one interval and
the first cycle has none. Nothing sleeps.

Absent, never 0: on GPUs that `nvmlGpmQueryDeviceSupport` says lack GPM, on drivers without
the GPM functions, on GPUs in MIG mode (per-instance GPM is not collected), for a metric the
GPU answers with a non-zero per-metric return code, and for one cycle after a failed sample
(the pair is restarted). `trainwatch_gpu_gpm_supported` says which GPUs have GPM at all.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.node.gpu.snapshot import Sample


@dataclass(frozen=True)
class GpmMetric:
    """A row of the metric table read through GPM (catalog.Metric.gpm names the GPM metric,
    catalog.Metric.scale converts its value to the row's base unit), with NVML's id for it."""

    name: str
    gpm_id: int
    scale: float  # GPM value * scale = our base unit (ratio 0-1, bytes per second)


GPM_METRICS: tuple[GpmMetric, ...] = tuple(
    GpmMetric(row.name, getattr(pynvml, f"NVML_GPM_METRIC_{row.gpm}"), row.scale or 1.0)
    for row in c.metrics_of("gpu") if row.gpm)
GPM_NAMES: tuple[str, ...] = tuple(row.name for row in GPM_METRICS)
NVML_SUCCESS = pynvml.NVML_SUCCESS


@dataclass
class _GpuState:
    """Per GPU: support (None: not asked yet), the two sample buffers, the request struct."""

    supported: bool | None = None
    samples: list[Any] = field(default_factory=list)
    previous: Any = None  # the buffer holding the last good sample, or None
    request: Any = None


class GpmReader:
    """Reads GPM for the DeviceReader; `call` is its NVML call with the error policy applied
    (None: absent this cycle; lost and gone errors propagate)."""

    def __init__(self, nvml: Any, call: Callable[..., Any]) -> None:
        self.nvml = nvml
        self.call = call
        self.gpus: dict[int, _GpuState] = {}
        self.cycle_seconds = 0.0  # time spent in GPM calls during the current cycle

    def reset(self) -> None:
        """NVML is being re-initialised: old sample buffers are gone with the session."""
        for state in self.gpus.values():
            for sample in state.samples:
                with contextlib.suppress(pynvml.NVMLError, AttributeError):
                    self.nvml.nvmlGpmSampleFree(sample)
        self.gpus.clear()

    def read(self, index: int, handle: Any, mig_enabled: bool,
             emit: Callable[[Sample], None]) -> None:
        started = time.perf_counter()
        try:
            self._read(index, handle, mig_enabled, emit)
        finally:
            self.cycle_seconds += time.perf_counter() - started

    def _read(self, index: int, handle: Any, mig_enabled: bool,
              emit: Callable[[Sample], None]) -> None:
        state = self.gpus.setdefault(index, _GpuState())
        if state.supported is None:
            # None: a driver without GPM (before 520) or an error (counted); asked again next
            # cycle, which costs a symbol lookup, and reported unsupported meanwhile
            support = self.call("nvmlGpmQueryDeviceSupport", handle)
            if support is not None:
                state.supported = bool(support.isSupportedDevice)
        usable = bool(state.supported) and not mig_enabled
        emit(Sample(c.GPU_GPM_SUPPORTED, 1.0 if usable else 0.0))
        if not usable:
            state.previous = None
            return
        if not state.samples:
            pair = [self.call("nvmlGpmSampleAlloc") for _ in range(2)]
            if any(sample is None for sample in pair):
                return
            state.samples = pair
            state.request = self._new_request()
        current = state.samples[1] if state.previous is state.samples[0] else state.samples[0]
        if self.call("nvmlGpmSampleGet", handle, current) is None:
            state.previous = None  # start a fresh pair next cycle
            return
        previous, state.previous = state.previous, current
        if previous is not None:
            self._metrics(state.request, previous, current, emit)

    def _new_request(self) -> Any:
        """One request struct per GPU, reused every cycle (the ctypes struct is ~19 KB)."""
        request = self.nvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        for i, row in enumerate(GPM_METRICS):
            request.metrics[i].metricId = row.gpm_id
        return request

    def _metrics(self, request: Any, previous: Any, current: Any,
                 emit: Callable[[Sample], None]) -> None:
        request.sample1 = previous
        request.sample2 = current
        if self.call("nvmlGpmMetricsGet", request) is None:
            return
        for i, row in enumerate(GPM_METRICS):
            result = request.metrics[i]
            if result.nvmlReturn == NVML_SUCCESS:  # per metric: unsupported ones are absent
                emit(Sample(row.name, float(result.value) * row.scale))
