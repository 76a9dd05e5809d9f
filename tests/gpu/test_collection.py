"""Collection behaviour against the fake NVML (real pynvml exception classes; no GPU here)."""

from __future__ import annotations

import pytest

from tests.gpu.helpers import make_loop, parse, render, static_fake, value, values
from trainwatch.exporters.contract import catalog as c


@pytest.mark.parametrize("gpus", [1, 8])
def test_fake_nvml_every_gpu_reports_its_values_in_base_units(gpus: int) -> None:
    fake = static_fake(gpus)
    loop = make_loop(fake)
    loop.run_once()
    series = parse(render(loop))
    assert len(values(series, c.GPU_UP)) == gpus
    for i in range(gpus):
        gpu = str(i)
        assert value(series, c.GPU_UP, gpu=gpu) == 1
        assert value(series, c.GPU_MEMORY_TOTAL, gpu=gpu) == 80 * 2**30
        assert value(series, c.GPU_MEMORY_USED, gpu=gpu) == (60 + i) * 2**30
        assert value(series, c.GPU_MEMORY_RESERVED, gpu=gpu) == 480 * 2**20
        assert value(series, c.GPU_MEMORY_FREE, gpu=gpu) == (20 - i) * 2**30 - 480 * 2**20
        assert value(series, c.GPU_UTILIZATION, gpu=gpu) == pytest.approx((90 - i) / 100)
        assert value(series, c.GPU_POWER_USAGE, gpu=gpu) == pytest.approx(500 + i)
        assert value(series, c.GPU_POWER_LIMIT, gpu=gpu) == 700
        assert value(series, c.GPU_SM_CLOCK, gpu=gpu) == 1980e6
        assert value(series, c.GPU_TEMPERATURE, gpu=gpu) == 55 + i
        assert value(series, c.GPU_ENERGY, gpu=gpu) == pytest.approx(1_000_000 + i / 1000)
        assert value(series, c.GPU_ECC_ERRORS, gpu=gpu, error_type="corrected",
                     counter="aggregate") == 2
    assert value(series, c.GPU_EXPORTER_NVML_UP) == 1
    assert value(series, c.GPU_EXPORTER_STALE) == 0
    assert value(series, c.GPU_EXPORTER_SIMULATED) == 1
    assert value(series, c.GPU_DRIVER_INFO, driver_version="550.54.15", cuda_version="12.4") == 1


def test_clock_event_reasons_are_flags() -> None:
    fake = static_fake(1)
    fake.update(lambda s: s["gpus"][0].update(clock_event_reasons=0x4 | 0x40))
    loop = make_loop(fake)
    loop.run_once()
    series = parse(render(loop))
    active = {dict(lbls)["reason"] for (n, lbls), v in series.items()
              if n == c.GPU_CLOCK_EVENT_REASON and v == 1}
    assert active == {"sw_power_cap", "hw_thermal_slowdown"}
    # sparse: the inactive reasons are not served (tests/gpu/test_sparse_errors.py)
    assert len(values(series, c.GPU_CLOCK_EVENT_REASON)) == 2


NOT_SUPPORTED_CASES = {
    "nvmlDeviceGetTemperature": [c.GPU_TEMPERATURE],
    "nvmlDeviceGetPowerUsage": [c.GPU_POWER_USAGE],
    "nvmlDeviceGetTotalEnergyConsumption": [c.GPU_ENERGY],
    "nvmlDeviceGetUtilizationRates": [c.GPU_UTILIZATION, c.GPU_MEMORY_UTILIZATION],
    "nvmlDeviceGetTotalEccErrors": [c.GPU_ECC_ERRORS],
    "nvmlDeviceGetRemappedRows": [c.GPU_REMAPPED_ROWS, c.GPU_ROW_REMAP_PENDING,
                                  c.GPU_ROW_REMAP_FAILURE],
    "nvmlDeviceGetNvLinkState": [c.GPU_NVLINK_UP, c.GPU_NVLINK_ERRORS],
    "nvmlDeviceGetMigMode": [c.GPU_MIG_ENABLED],
    "nvmlDeviceGetCurrentClocksThrottleReasons": [],  # only the fallback: still reported
    "nvmlDeviceGetPcieReplayCounter": [c.GPU_PCIE_REPLAYS],
    "nvmlDeviceGetComputeRunningProcesses": [c.GPU_PROCESSES, c.GPU_PROCESS_MEMORY],
}


@pytest.mark.parametrize("call", sorted(NOT_SUPPORTED_CASES))
def test_not_supported_field_is_absent_not_zero_and_not_an_error(call: str) -> None:
    fake = static_fake(2)
    # a failed remap and a clock-event reason on both GPUs: the sparse (served while
    # non-zero) series are served on the GPU that supports them
    for gpu in range(2):
        fake.update(lambda s, gpu=gpu: s["gpus"][gpu].update(remapped_rows=[0, 0, 0, 1],
                                                             clock_event_reasons=0x4))
    fake.update(lambda s: s["gpus"][1].update(not_supported=[call]))
    loop = make_loop(fake)
    loop.run_once()
    series = parse(render(loop))
    if call == "nvmlDeviceGetCurrentClocksThrottleReasons":
        assert values(series, c.GPU_CLOCK_EVENT_REASON, gpu="1", reason="sw_power_cap") == [1]
    for metric in NOT_SUPPORTED_CASES[call]:
        assert values(series, metric, gpu="0"), f"{metric} missing on the healthy GPU"
        assert values(series, metric, gpu="1") == [], f"{metric} present though NotSupported"
    assert value(series, c.GPU_UP, gpu="1") == 1
    assert values(series, c.GPU_EXPORTER_ERRORS) == []
    other = c.GPU_TEMPERATURE if call != "nvmlDeviceGetTemperature" else c.GPU_POWER_USAGE
    assert value(series, other,
                 gpu="1") > 0


def test_other_nvml_errors_are_counted_by_call_and_error() -> None:
    fake = static_fake(1)
    fake.update(lambda s: s["gpus"][0].update(errors={"nvmlDeviceGetPowerUsage": "NoPermission"}))
    loop = make_loop(fake)
    loop.run_once()
    loop.run_once()
    series = parse(render(loop))
    assert value(series, c.GPU_EXPORTER_ERRORS, call="nvmlDeviceGetPowerUsage",
                 error="NoPermission") == 2
    assert values(series, c.GPU_POWER_USAGE) == []
    assert value(series, c.GPU_UP, gpu="0") == 1


def test_gpu_lost_mid_run_goes_down_and_the_others_keep_reporting() -> None:
    fake = static_fake(4)  # the fake NVML stands in for the GPUs
    loop = make_loop(fake)
    loop.run_once()
    assert values(parse(render(loop)), c.GPU_LOST) == []  # sparse: no lost GPU, no series
    fake.update(lambda s: s["gpus"][2].update(lost=True))
    loop.run_once()
    series = parse(render(loop))
    assert value(series, c.GPU_UP, gpu="2", uuid="GPU-5a1e0000-0000-4000-8000-000000000002") == 0
    assert values(series, c.GPU_TEMPERATURE, gpu="2") == []
    # the flag GpuLost reads: only the lost GPU has it
    assert value(series, c.GPU_LOST, gpu="2") == 1
    assert values(series, c.GPU_LOST, gpu="0") == []
    for gpu in ("0", "1", "3"):
        assert value(series, c.GPU_UP, gpu=gpu) == 1
        assert value(series, c.GPU_TEMPERATURE, gpu=gpu) > 0
    assert value(series, c.GPU_EXPORTER_NVML_UP) == 1
    assert value(series, c.GPU_EXPORTER_ERRORS, error="GpuIsLost") >= 1


def test_handle_error_marks_only_that_gpu_down() -> None:
    fake = static_fake(2)
    fake.update(lambda s: s["gpus"][0].update(errors={"nvmlDeviceGetHandleByIndex": "Unknown"}))
    loop = make_loop(fake)
    loop.run_once()
    series = parse(render(loop))
    assert value(series, c.GPU_UP, gpu="0") == 0
    assert value(series, c.GPU_UP, gpu="1") == 1
    assert value(series, c.GPU_EXPORTER_ERRORS, call="nvmlDeviceGetHandleByIndex",
                 error="Unknown") == 1


def test_init_failure_keeps_serving_and_recovers_with_backoff() -> None:
    fake = static_fake(2)
    fake.update(lambda s: s.update(init_error="DriverNotLoaded", init_failures=2))
    loop = make_loop(fake, interval=10.0)
    loop.run_once()
    series = parse(render(loop))
    assert value(series, c.GPU_EXPORTER_NVML_UP) == 0
    assert values(series, c.GPU_UP) == []
    assert value(series, c.GPU_EXPORTER_ERRORS, call="nvmlInit", error="DriverNotLoaded") == 1
    # Within the backoff window a cycle serves "NVML down" without calling nvmlInit again.
    assert loop.run_once().nvml_up is False
    assert fake.init_attempts == 1
    for expected_attempts in (2, 3):  # the backoff has passed (we move the clock, not sleep)
        loop._next_init = 0.0
        loop.run_once()
        assert fake.init_attempts == expected_attempts
    series = parse(render(loop))
    assert value(series, c.GPU_EXPORTER_NVML_UP) == 1
    assert value(series, c.GPU_UP, gpu="1") == 1
    assert value(series, c.GPU_EXPORTER_ERRORS, call="nvmlInit", error="DriverNotLoaded") == 2


def test_init_backoff_grows_and_is_capped() -> None:
    fake = static_fake(1)
    fake.update(lambda s: s.update(init_error="LibraryNotFound"))
    loop = make_loop(fake, interval=1.0)
    seen = []
    for _ in range(10):
        loop._next_init = 0.0
        loop.run_once()
        seen.append(loop._backoff)
    assert seen[:3] == [2.0, 4.0, 8.0]
    assert max(seen) == 60.0


def test_driver_gone_mid_run_reports_known_gpus_down_then_reinitialises() -> None:
    fake = static_fake(2)
    loop = make_loop(fake)
    loop.run_once()
    fake.update(lambda s: s.update(init_error="DriverNotLoaded", init_failures=-1))
    fake.unload_driver()
    loop.run_once()
    series = parse(render(loop))
    assert value(series, c.GPU_EXPORTER_NVML_UP) == 0
    assert values(series, c.GPU_UP) == [0.0, 0.0]
    fake.update(lambda s: s.update(init_error=None))
    loop._next_init = 0.0
    loop.run_once()
    series = parse(render(loop))
    assert value(series, c.GPU_EXPORTER_NVML_UP) == 1
    assert values(series, c.GPU_UP) == [1.0, 1.0]


def test_mig_devices_are_reported_when_enabled() -> None:
    fake = static_fake(1)
    devices = [{"uuid": f"MIG-{i}", "memory_total": 10 * 2**30, "memory_used": i * 2**30}
               for i in range(3)]
    fake.update(lambda s: s["gpus"][0].update(mig={"enabled": True, "devices": devices}))
    loop = make_loop(fake)
    loop.run_once()
    series = parse(render(loop))
    assert value(series, c.GPU_MIG_ENABLED, gpu="0") == 1
    assert value(series, c.GPU_MIG_MEMORY_USED, mig_index="2", mig_uuid="MIG-2") == 2 * 2**30
    assert len(values(series, c.GPU_MIG_MEMORY_TOTAL)) == 3


def test_clock_reasons_fall_back_to_the_pre_535_call() -> None:
    fake = static_fake(2)
    fake.update(lambda s: s["gpus"][1].update(
        errors={"nvmlDeviceGetCurrentClocksEventReasons": "FunctionNotFound"},
        clock_event_reasons=0x8))
    loop = make_loop(fake)
    loop.run_once()
    series = parse(render(loop))
    assert value(series, c.GPU_CLOCK_EVENT_REASON, gpu="1", reason="hw_slowdown") == 1
    assert values(series, c.GPU_EXPORTER_ERRORS) == []


def test_both_clock_reason_calls_unsupported_means_absent() -> None:
    fake = static_fake(1)
    fake.update(lambda s: s["gpus"][0].update(not_supported=[
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"]))
    loop = make_loop(fake)
    loop.run_once()
    assert values(parse(render(loop)), c.GPU_CLOCK_EVENT_REASON) == []
