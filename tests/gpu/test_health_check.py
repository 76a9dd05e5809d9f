"""trainwatch.exporters.node.gpu.health_check against the fake NVML (which raises pynvml's real
errors): what
keeps a drained node out of service."""

from __future__ import annotations

from trainwatch.exporters.node.gpu.fake_nvml import FakeNvml, simulated_scenario
from trainwatch.exporters.node.gpu.health_check import check


def _nvml(**gpu0: object) -> FakeNvml:
    scenario = simulated_scenario(2, dynamic=False)
    scenario["gpus"][0].update(gpu0)
    return FakeNvml(scenario)


def test_healthy_node() -> None:
    report = check(_nvml(), expect_gpus=2)
    assert report["healthy"] and report["problems"] == []
    assert [g["index"] for g in report["gpus"]] == [0, 1]


def test_lost_gpu_pending_and_failed_remap_ecc_and_missing_gpus() -> None:
    assert "GPU 0" in check(_nvml(lost=True))["problems"][0]
    assert "pending remapping" in check(_nvml(remapped_rows=[0, 1, 1, 0]))["problems"][0]
    assert "RMA" in check(_nvml(remapped_rows=[0, 1, 0, 1]))["problems"][0]
    assert "ECC" in check(_nvml(ecc={"uncorrected_volatile": 3}))["problems"][0]
    assert "3 expected" in check(_nvml(), expect_gpus=3)["problems"][0]


def test_unsupported_remap_is_not_a_problem() -> None:
    report = check(_nvml(not_supported=["nvmlDeviceGetRemappedRows"]))
    assert report["healthy"] and report["gpus"][0]["remapped_rows"] == "not supported"
