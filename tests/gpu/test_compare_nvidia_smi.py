"""The nvidia-smi comparison's unit conversions and verdicts, on a fake-NVML scrape.

nvidia-smi itself cannot run here (no GPU); these rows are what it prints for the simulated
GPU, in its units (MiB, %, W, MHz).
"""

from __future__ import annotations

from tests.gpu.helpers import make_loop, render, static_fake
from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.node.gpu.compare_nvidia_smi import FIELDS, compare, per_gpu_values

SMI_ROW = {
    "index": "0", "uuid": "GPU-5a1e0000-0000-4000-8000-000000000000",
    "memory.total": "81920", "memory.used": "61440", "memory.reserved": "480",
    "utilization.gpu": "88",
    "utilization.memory": "40", "temperature.gpu": "56", "power.draw": "512.30",
    "power.limit": "700.00", "power.min_limit": "200.00", "power.max_limit": "700.00",
    "power.default_limit": "700.00", "clocks.sm": "1980", "clocks.mem": "2619",
    "pcie.link.gen.current": "5", "pcie.link.width.current": "16",
    "ecc.errors.corrected.volatile.total": "0", "ecc.errors.uncorrected.aggregate.total": "0",
}


def scraped(**gpu_changes: object) -> dict:
    fake = static_fake(1)
    fake.update(lambda s: s["gpus"][0].update(gpu_changes))
    loop = make_loop(fake)
    loop.run_once()
    return per_gpu_values(render(loop))


def test_every_field_agrees_with_a_matching_nvidia_smi_row() -> None:
    results = compare([SMI_ROW], scraped())
    assert len(results) == len(FIELDS)
    assert [r["field"] for r in results if not r["ok"]] == []


def test_a_real_difference_is_reported() -> None:
    results = compare([{**SMI_ROW, "power.limit": "450.00", "memory.total": "40960"}], scraped())
    assert sorted(r["field"] for r in results if not r["ok"]) == ["memory.total", "power.limit"]


def test_not_supported_in_nvidia_smi_must_be_absent_in_the_scrape() -> None:
    row = {**SMI_ROW, "ecc.errors.corrected.volatile.total": "[N/A]"}
    counted = scraped(ecc={"corrected_volatile": 3})
    assert not next(r for r in compare([row], counted)
                    if r["field"] == "ecc.errors.corrected.volatile.total")["ok"]
    absent = scraped(not_supported=["nvmlDeviceGetTotalEccErrors"])
    assert next(r for r in compare([row], absent)
                if r["field"] == "ecc.errors.corrected.volatile.total")["ok"]


def test_an_absent_sparse_error_counter_reads_as_zero_and_a_served_one_is_compared() -> None:
    """ECC counters are served from their first error: absent is nvidia-smi's 0, and once
    served the value itself is compared."""
    field = "ecc.errors.uncorrected.aggregate.total"
    healthy = scraped()
    assert (c.GPU_ECC_ERRORS, "0", (("counter", "aggregate"), ("error_type", "uncorrected"))) \
        not in healthy
    assert next(r for r in compare([SMI_ROW], healthy) if r["field"] == field)["ok"]
    counted = scraped(ecc={"uncorrected_aggregate": 2})
    assert next(r for r in compare([{**SMI_ROW, field: "2"}], counted)
                if r["field"] == field)["ok"]
    assert not next(r for r in compare([SMI_ROW], counted) if r["field"] == field)["ok"]
