"""Error series a healthy GPU keeps at zero are served only while non-zero (the metric
table's `sparse` rows: XIDs, ECC error counters, the row-remap failure flag, the clock-event
reason flags).

Why: every PromQL read costs Prometheus ~10 us of CPU per matched series, whatever the
expression drops afterwards, and the GPU alerts read these every 15 s; at 8,192 GPUs the
zeros alone cost about as much as all other GPU alerts together (docs/gpu_exporter.md,
"Sparse error series"). The alerts' `x > 0 unless x offset w` clause catches a counter born
non-zero (alert_rules/tests/production/gpu_test.yml proves it with promtool).

The GPU is the fake NVML (exporters/node/gpu/fake_nvml.py: no GPU on this machine); the XID
events go through the real XID watch thread.
"""

from __future__ import annotations

from pathlib import Path

import pynvml

from tests.gpu.helpers import (
    Series,
    make_loop,
    parse,
    render,
    started,
    static_fake,
    value,
    values,
)
from tests.support.net import wait_until
from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.node.gpu.exposition import SPARSE

HEALTHY_ECC = {"corrected_volatile": 0, "corrected_aggregate": 0,
               "uncorrected_volatile": 0, "uncorrected_aggregate": 0}


def test_the_sparse_rows_are_the_error_series_the_alerts_read() -> None:
    assert {c.GPU_XID_ERRORS, c.GPU_ECC_ERRORS, c.GPU_ROW_REMAP_FAILURE,
            c.GPU_CLOCK_EVENT_REASON, c.GPU_LOST} == SPARSE
    for name in SPARSE:
        assert c.SPARSE_NOTE in c.METRICS[name].source  # the docs' table says so


def test_a_healthy_gpu_serves_no_error_series_and_an_injected_error_appears() -> None:
    fake = static_fake(2)
    for gpu in range(2):
        fake.update(lambda s, gpu=gpu: s["gpus"][gpu].update(ecc=dict(HEALTHY_ECC),
                                                             remapped_rows=[0, 0, 0, 0]))
    loop = make_loop(fake, interval=0.05, watch_xid=True)
    with started(loop):
        healthy = wait_until(
            lambda: loop.xid_watch_up() and loop.snapshot is not None and parse(render(loop)),
            timeout=30, what="the XID watch and a first snapshot")
        for name in SPARSE:
            assert values(healthy, name) == [], f"{name} served by a healthy GPU"
        # their dense neighbours from the same NVML calls are still there
        assert len(values(healthy, c.GPU_REMAPPED_ROWS)) == 4
        assert values(healthy, c.GPU_ROW_REMAP_PENDING) == [0.0, 0.0]

        fake.inject_xid(1, 79)
        fake.update(lambda s: s["gpus"][1].update(
            ecc={**HEALTHY_ECC, "uncorrected_volatile": 1, "uncorrected_aggregate": 1},
            remapped_rows=[0, 1, 0, 1], clock_event_reasons=0x40))

        def errors_served() -> Series | None:
            series = parse(render(loop))
            return series if values(series, c.GPU_XID_ERRORS) and values(
                series, c.GPU_ROW_REMAP_FAILURE) else None

        after = wait_until(errors_served, timeout=30, what="the injected errors to be served")
    assert value(after, c.GPU_XID_ERRORS, gpu="1", xid="79") == 1
    assert value(after, c.GPU_ECC_ERRORS, gpu="1", error_type="uncorrected",
                 counter="volatile") == 1
    assert value(after, c.GPU_ROW_REMAP_FAILURE, gpu="1") == 1
    assert value(after, c.GPU_CLOCK_EVENT_REASON, gpu="1") == 1  # only the active reason
    assert value(after, c.GPU_CLOCK_EVENT_REASON, reason="hw_thermal_slowdown") == 1
    # only the errors that happened, only on the GPU they happened on
    assert len(values(after, c.GPU_ECC_ERRORS)) == 2
    assert values(after, c.GPU_XID_ERRORS, gpu="0") == []
    assert values(after, c.GPU_ROW_REMAP_FAILURE, gpu="0") == []


def test_a_volatile_counter_reset_by_a_driver_reload_leaves_the_scrape_again() -> None:
    fake = static_fake(1)
    fake.update(lambda s: s["gpus"][0].update(ecc={**HEALTHY_ECC, "uncorrected_volatile": 2}))
    loop = make_loop(fake)
    loop.run_once()
    assert value(parse(render(loop)), c.GPU_ECC_ERRORS, error_type="uncorrected",
                 counter="volatile") == 2
    fake.update(lambda s: s["gpus"][0].update(ecc=dict(HEALTHY_ECC)))
    loop.run_once()
    assert values(parse(render(loop)), c.GPU_ECC_ERRORS) == []


def test_a_reason_that_ends_leaves_the_scrape() -> None:
    fake = static_fake(1)
    fake.update(lambda s: s["gpus"][0].update(clock_event_reasons=0x4 | 0x40))
    loop = make_loop(fake)
    loop.run_once()
    assert len(values(parse(render(loop)), c.GPU_CLOCK_EVENT_REASON)) == 2
    fake.update(lambda s: s["gpus"][0].update(clock_event_reasons=0x4))
    loop.run_once()
    assert values(parse(render(loop)), c.GPU_CLOCK_EVENT_REASON) == [1.0]


H100_IDLE_SCRAPE = Path(__file__).parent / "fixtures" / "h100" / "trainwatch-scrape-idle.prom"


def _sparse_samples(series: Series) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The sparse rows' samples, without the GPU's identity labels."""
    return {(name, frozenset((k, v) for k, v in labels if k not in c.GPU_LABELS)): val
            for (name, labels), val in series.items() if name in SPARSE}


def test_the_real_idle_h100_scrape_keeps_only_its_non_zero_sparse_samples() -> None:
    """The H100 scrape (tests/gpu/fixtures/h100/, taken before the sparse rows) served 13
    zeros in these rows; today's exporter, on a fake NVML answering as that idle H100 did
    (no ECC error, no remap, the gpu_idle reason), serves exactly its non-zero ones."""
    real = _sparse_samples(parse(H100_IDLE_SCRAPE.read_text()))
    assert sorted(real.values()).count(0.0) == 13
    fake = static_fake(1)
    fake.update(lambda s: s["gpus"][0].update(
        ecc=dict(HEALTHY_ECC), remapped_rows=[0, 0, 0, 0],
        clock_event_reasons=pynvml.nvmlClocksEventReasonGpuIdle))
    loop = make_loop(fake)
    loop.run_once()
    served = _sparse_samples(parse(render(loop)))
    assert served == {key: val for key, val in real.items() if val != 0.0}
    assert served == {(c.GPU_CLOCK_EVENT_REASON, frozenset({("reason", "gpu_idle")})): 1.0}
