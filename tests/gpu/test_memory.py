"""Memory like nvidia-smi: NVML v2 memory info where the driver has it, v1 elsewhere.

Fake NVML (no GPU here), modelled on the H100 readings in tests/gpu/fixtures/h100/: idle with
driver 580, v1 says used 480 MiB; v2 says used 0, reserved 480 MiB; nvidia-smi says used 0,
reserved 480 MiB.
"""

from __future__ import annotations

import pynvml

from tests.gpu.helpers import make_loop, parse, render, static_fake, value, values
from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.node.gpu.compare_nvidia_smi import compare, per_gpu_values

MIB = 2**20
H100_TOTAL = 81559 * MIB  # nvidia-smi -q on the H100 (tests/gpu/fixtures/h100/)
H100_RESERVED = 480 * MIB


def idle_h100(memory_v2: bool) -> dict:
    fake = static_fake(1)
    fake.update(lambda s: s.update(memory_v2=memory_v2, driver_version="580.159.04"))
    fake.update(lambda s: s["gpus"][0].update(memory_total=H100_TOTAL, memory_used=0,
                                              memory_reserved=H100_RESERVED, processes=[]))
    loop = make_loop(fake)
    loop.run_once()
    return parse(render(loop))


def test_v2_driver_reports_used_without_the_reservation_like_nvidia_smi() -> None:
    series = idle_h100(memory_v2=True)
    assert value(series, c.GPU_MEMORY_USED, gpu="0") == 0
    assert value(series, c.GPU_MEMORY_RESERVED, gpu="0") == H100_RESERVED
    assert value(series, c.GPU_MEMORY_FREE, gpu="0") == 81079 * MIB
    assert value(series, c.GPU_MEMORY_TOTAL, gpu="0") == H100_TOTAL
    assert values(series, c.GPU_EXPORTER_ERRORS) == []


def test_v1_only_driver_reports_v1_and_no_reserved_series() -> None:
    series = idle_h100(memory_v2=False)
    assert value(series, c.GPU_MEMORY_USED, gpu="0") == H100_RESERVED  # v1 folds it into used
    assert value(series, c.GPU_MEMORY_FREE, gpu="0") == 81079 * MIB
    assert values(series, c.GPU_MEMORY_RESERVED) == []
    assert values(series, c.GPU_EXPORTER_ERRORS) == []  # a missing v2 symbol is not an error


def test_v1_only_driver_is_asked_for_v2_once_per_nvml_session() -> None:
    fake = static_fake(2)
    fake.update(lambda s: s.update(memory_v2=False))
    loop = make_loop(fake)
    asked: list[object] = []
    original = fake.nvmlDeviceGetMemoryInfo

    def spy(handle: object, version: int | None = None) -> object:
        asked.append(version)
        return original(handle, version=version)

    fake.nvmlDeviceGetMemoryInfo = spy  # type: ignore[method-assign]
    for _ in range(3):
        loop.run_once()
    assert asked.count(pynvml.nvmlMemory_v2) == 1
    assert asked.count(None) == 6


def test_v2_not_supported_on_one_gpu_falls_back_to_v1_for_that_gpu_only() -> None:
    fake = static_fake(2)
    fake.update(lambda s: s["gpus"][1].update(not_supported=["nvmlDeviceGetMemoryInfo_v2"]))
    loop = make_loop(fake)
    loop.run_once()
    series = parse(render(loop))
    assert value(series, c.GPU_MEMORY_RESERVED, gpu="0") == H100_RESERVED
    assert values(series, c.GPU_MEMORY_RESERVED, gpu="1") == []
    assert value(series, c.GPU_MEMORY_USED, gpu="1") == 61 * 2**30 + H100_RESERVED


def test_v2_failing_is_counted_and_the_memory_series_are_absent_this_cycle() -> None:
    fake = static_fake(1)
    fake.update(lambda s: s["gpus"][0].update(errors={"nvmlDeviceGetMemoryInfo_v2": "Unknown"}))
    loop = make_loop(fake)
    loop.run_once()
    series = parse(render(loop))
    assert values(series, c.GPU_MEMORY_USED) == []
    assert value(series, c.GPU_EXPORTER_ERRORS, call="nvmlDeviceGetMemoryInfo_v2",
                 error="Unknown") == 1
    assert value(series, c.GPU_UP, gpu="0") == 1


def test_memory_used_agrees_with_the_real_nvidia_smi_reading() -> None:
    """The H100's nvidia-smi said memory.used 0, reserved 480; the old v1 exporter said 480."""
    series = per_gpu_values(render_idle_h100())
    row = {"index": "0", "memory.total": "81559", "memory.used": "0", "memory.reserved": "480"}
    results = {r["field"]: r for r in compare([row], series, fields=("memory.total",
                                                                      "memory.used",
                                                                      "memory.reserved"))}
    assert all(r["ok"] for r in results.values()), results


def render_idle_h100() -> str:
    fake = static_fake(1)
    fake.update(lambda s: s["gpus"][0].update(memory_total=H100_TOTAL, memory_used=0,
                                              memory_reserved=H100_RESERVED))
    loop = make_loop(fake)
    loop.run_once()
    return render(loop)
