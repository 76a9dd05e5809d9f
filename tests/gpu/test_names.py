"""The exporter serves exactly the GPU rows of the metric table (exporters/contract/catalog.py):
each
name, type, HELP text and label set, and nothing else."""

from __future__ import annotations

import pytest

from tests.gpu.helpers import make_loop, parse, render, static_fake, value, values
from tests.support import metric_table
from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.node.gpu.config import ScenarioError
from trainwatch.exporters.node.gpu.fake_nvml import FakeNvml


def test_served_families_are_the_tables_gpu_rows() -> None:
    fake = static_fake(3)
    devices = [{"uuid": "MIG-0", "memory_total": 2**30, "memory_used": 0}]
    fake.update(lambda s: s["gpus"][0].update(mig={"enabled": True, "devices": devices}))
    # the sparse rows are served only while non-zero: give GPU 1 each of them, lose GPU 2
    fake.update(lambda s: s["gpus"][1].update(remapped_rows=[0, 1, 0, 1], clock_event_reasons=0x4))
    loop = make_loop(fake, watch_xid=False)
    loop.run_once()
    fake.update(lambda s: s["gpus"][2].update(lost=True))
    loop.run_once()  # GPM values need two cycles
    loop.xid_counts.inc((loop.reader.identities[0], "79"))
    loop.errors.inc(("nvmlDeviceGetPowerUsage", "Unknown"))
    assert metric_table.mismatches(render(loop), "gpu", complete=True) == []


def test_the_check_notices_help_text_that_left_the_table() -> None:
    text = ("# HELP trainwatch_gpu_up something else\n# TYPE trainwatch_gpu_up gauge\n"
            'trainwatch_gpu_up{gpu="0",uuid="u",name="n"} 1\n')
    assert metric_table.mismatches(text, "gpu", complete=False) == [
        "trainwatch_gpu_up: served as gauge 'something else', table says gauge "
        "'1 if the GPU answered NVML in the last cycle, 0 if it is lost or unreachable.'"]


def test_a_plain_getter_row_is_read_and_faked_from_the_table_alone() -> None:
    """pcie_link_width has no reader or fake code: its row names the NVML call and scale."""
    fake = static_fake(2)
    fake.update(lambda s: s["gpus"][1].update(nvml={"nvmlDeviceGetCurrPcieLinkWidth": 8},
                                              not_supported=["nvmlDeviceGetPcieReplayCounter"]))
    loop = make_loop(fake, watch_xid=False)
    loop.run_once()
    series = parse(render(loop))
    assert value(series, c.GPU_PCIE_LINK_WIDTH, gpu="0") == 16  # the row's simulated value
    assert value(series, c.GPU_PCIE_LINK_WIDTH, gpu="1") == 8  # the scenario's
    assert values(series, c.GPU_PCIE_REPLAYS, gpu="1") == []  # NotSupported: absent


def test_a_scenario_naming_a_call_outside_the_table_is_refused() -> None:
    scenario = {"gpus": [{"nvml": {"nvmlDeviceGetMadeUp": 1}}]}
    with pytest.raises(ScenarioError, match="nvmlDeviceGetMadeUp"):
        FakeNvml(scenario)
