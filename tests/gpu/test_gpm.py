"""GPM profiling metrics against the fake NVML (no GPU here): supported, unsupported, failing
per GPU, MIG, and the cost per cycle. The supported GPU's values are the H100's readings
during a bf16 matmul loop (tests/gpu/fixtures/h100/gpm-during-bf16-matmul.txt)."""

from __future__ import annotations

import pytest

from tests.gpu.helpers import make_loop, parse, render, static_fake, value, values
from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.node.gpu.fake_nvml import FakeNvml
from trainwatch.exporters.node.gpu.gpm import GPM_METRICS, GPM_NAMES


def scrape_after(fake: FakeNvml, cycles: int = 2) -> dict:
    loop = make_loop(fake)
    for _ in range(cycles):
        loop.run_once()
    return parse(render(loop))


def test_supported_gpu_reports_the_h100_readings_as_ratios_and_bytes_per_second() -> None:
    series = scrape_after(static_fake(1))
    assert value(series, c.GPU_GPM_SUPPORTED, gpu="0") == 1
    assert value(series, c.GPU_SM_ACTIVE, gpu="0") == pytest.approx(0.6227)
    assert value(series, c.GPU_SM_OCCUPANCY, gpu="0") == pytest.approx(0.0921)
    assert value(series, c.GPU_TENSOR_ACTIVE, gpu="0") == pytest.approx(0.6040)
    assert value(series, c.GPU_DRAM_ACTIVE, gpu="0") == pytest.approx(0.1641)
    assert value(series, c.GPU_GRAPHICS_ENGINE_ACTIVE, gpu="0") == pytest.approx(0.6746)
    assert value(series, c.GPU_FP16_ACTIVE, gpu="0") == 0  # measured 0: present, not absent
    assert value(series, c.GPU_PCIE_RX_RATE, gpu="0") == 900 * 2**20
    assert value(series, c.GPU_NVLINK_TX_RATE, gpu="0") == 20480 * 2**20
    assert value(series, c.GPU_EXPORTER_GPM_DURATION) >= 0
    assert values(series, c.GPU_EXPORTER_ERRORS) == []


def test_first_cycle_has_no_gpm_values_since_a_metric_needs_two_samples() -> None:
    series = scrape_after(static_fake(1), cycles=1)
    assert value(series, c.GPU_GPM_SUPPORTED, gpu="0") == 1
    assert [n for n in GPM_NAMES if values(series, n)] == []


def test_unsupported_failing_and_mig_gpus_are_absent_and_the_others_go_on() -> None:
    fake = static_fake(5)
    fake.update(lambda s: s["gpus"][1].pop("gpm"))  # pre-Hopper: device support says no
    fake.update(lambda s: s["gpus"][2].update(errors={"nvmlGpmSampleGet": "Unknown"}))
    fake.update(lambda s: s["gpus"][3].update(
        mig={"enabled": True, "devices": [{"uuid": "MIG-1", "memory_total": 10 * 2**30}]}))
    fake.update(lambda s: s["gpus"][4].update(
        errors={"nvmlGpmQueryDeviceSupport": "FunctionNotFound"}))  # driver without GPM
    series = scrape_after(fake, cycles=3)
    assert value(series, c.GPU_SM_ACTIVE, gpu="0") == pytest.approx(0.6227)
    for gpu in ("1", "2", "3", "4"):
        assert [n for n in GPM_NAMES if values(series, n, gpu=gpu)] == [], gpu
        assert value(series, c.GPU_UP, gpu=gpu) == 1
        assert value(series, c.GPU_TEMPERATURE, gpu=gpu) > 0
    assert value(series, c.GPU_GPM_SUPPORTED, gpu="1") == 0
    assert value(series, c.GPU_GPM_SUPPORTED, gpu="3") == 0  # MIG enabled
    assert value(series, c.GPU_GPM_SUPPORTED, gpu="4") == 0
    assert value(series, c.GPU_GPM_SUPPORTED, gpu="2") == 1  # supported, but failing now
    assert value(series, c.GPU_EXPORTER_ERRORS, call="nvmlGpmSampleGet", error="Unknown") == 3
    assert values(series, c.GPU_EXPORTER_ERRORS, call="nvmlGpmQueryDeviceSupport") == []


def test_a_failed_sample_restarts_the_pair_and_values_come_back() -> None:
    fake = static_fake(1)
    loop = make_loop(fake)
    loop.run_once()
    loop.run_once()
    fake.update(lambda s: s["gpus"][0].update(errors={"nvmlGpmSampleGet": "Unknown"}))
    loop.run_once()
    assert values(parse(render(loop)), c.GPU_SM_ACTIVE) == []
    fake.update(lambda s: s["gpus"][0].update(errors={}))
    loop.run_once()  # first sample of a new pair: still nothing
    assert values(parse(render(loop)), c.GPU_SM_ACTIVE) == []
    loop.run_once()
    assert value(parse(render(loop)), c.GPU_SM_ACTIVE, gpu="0") == pytest.approx(0.6227)


def test_a_metric_the_gpu_does_not_offer_is_absent_the_others_present() -> None:
    fake = static_fake(1)
    fake.update(lambda s: s["gpus"][0]["gpm"]["metrics"].pop("NVLINK_TOTAL_TX_PER_SEC"))
    series = scrape_after(fake)
    assert values(series, c.GPU_NVLINK_TX_RATE) == []
    assert value(series, c.GPU_NVLINK_RX_RATE, gpu="0") > 0


def test_gpm_off_reads_nothing_and_exports_no_cost() -> None:
    fake = static_fake(1)
    loop = make_loop(fake)
    loop.reader.gpm = None
    loop.run_once()
    loop.run_once()
    series = parse(render(loop))
    assert values(series, c.GPU_GPM_SUPPORTED) == []
    assert values(series, c.GPU_EXPORTER_GPM_DURATION) == []


def test_sample_buffers_are_freed_when_the_nvml_session_ends() -> None:
    fake = static_fake(2)
    loop = make_loop(fake)
    loop.run_once()
    loop.run_once()
    assert loop.reader.gpm is not None
    buffers = [b for state in loop.reader.gpm.gpus.values() for b in state.samples]
    assert len(buffers) == 4
    loop.stop()  # never started: stop() still ends the session
    assert all(b.freed for b in buffers)


def test_every_gpm_row_has_help_a_dcgm_twin_and_a_catalog_name() -> None:
    names = {getattr(c, k) for k in dir(c) if k.startswith("GPU_")}
    for row in GPM_METRICS:
        assert row.name in names and c.METRICS[row.name].exporter == "gpu"
        assert c.METRICS[row.name].dcgm[0].startswith("DCGM_FI_PROF_")
        assert c.METRICS[row.name].help.endswith("GPM.")


def test_request_is_built_on_the_real_pynvml_struct() -> None:
    """The real ctypes struct (no driver needed to build it): ids, count, version, samples."""
    import pynvml

    from trainwatch.exporters.node.gpu.gpm import GpmReader

    request = GpmReader(pynvml, lambda *a: None)._new_request()
    assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
    assert request.numMetrics == len(GPM_METRICS)
    assert [request.metrics[i].metricId for i in range(len(GPM_METRICS))] == [
        row.gpm_id for row in GPM_METRICS]
    request.sample1 = pynvml.c_nvmlGpmSample_t()  # what nvmlGpmSampleAlloc returns
    request.sample2 = pynvml.c_nvmlGpmSample_t()


def test_gpm_is_on_by_default_and_off_with_the_flag_or_config(tmp_path) -> None:
    from trainwatch.exporters.node.gpu.config import build_parser, resolve

    assert resolve(build_parser().parse_args([])).gpm is True
    assert resolve(build_parser().parse_args(["--no-gpm"])).gpm is False
    config = tmp_path / "gpu.yml"
    config.write_text("gpm: false\n")
    assert resolve(build_parser().parse_args(["--config", str(config)])).gpm is False


def test_gpm_and_clock_event_reasons_are_the_catalogs_and_nvmls() -> None:
    """The GPM metric of each row, its scale, and the clock-event bits are facts of the
    metric table (the rule generator reads them without pynvml); here they meet NVML's."""
    import pynvml

    assert [(row.name, row.gpm_id, row.scale) for row in GPM_METRICS] == [
        (row.name, getattr(pynvml, f"NVML_GPM_METRIC_{row.gpm}"), row.scale)
        for row in c.metrics_of("gpu") if row.gpm]
    assert {row.name: row.scale for row in GPM_METRICS} == {
        **dict.fromkeys((c.GPU_GRAPHICS_ENGINE_ACTIVE, c.GPU_SM_ACTIVE, c.GPU_SM_OCCUPANCY,
                         c.GPU_TENSOR_ACTIVE, c.GPU_DRAM_ACTIVE, c.GPU_FP64_ACTIVE,
                         c.GPU_FP32_ACTIVE, c.GPU_FP16_ACTIVE), 0.01),  # GPM: percent
        **dict.fromkeys((c.GPU_PCIE_TX_RATE, c.GPU_PCIE_RX_RATE, c.GPU_NVLINK_TX_RATE,
                         c.GPU_NVLINK_RX_RATE), 2**20)}  # GPM: MiB/s
    for label, bit in c.CLOCK_EVENT_REASONS:  # gpu_idle: nvmlClocksEventReasonGpuIdle
        camel = "".join(part.capitalize() for part in label.split("_"))
        assert getattr(pynvml, f"nvmlClocksEventReason{camel}") == bit, label
