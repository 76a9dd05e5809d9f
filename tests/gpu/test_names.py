"""The exporter serves exactly the GPU rows of the metric table (exporters/catalog.py): each
name, type, HELP text and label set, and nothing else."""

from __future__ import annotations

from tests.gpu.helpers import make_loop, render, static_fake
from tests.support import metric_table


def test_served_families_are_the_tables_gpu_rows() -> None:
    fake = static_fake(2)
    devices = [{"uuid": "MIG-0", "memory_total": 2**30, "memory_used": 0}]
    fake.update(lambda s: s["gpus"][0].update(mig={"enabled": True, "devices": devices}))
    loop = make_loop(fake, watch_xid=False)
    loop.run_once()
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
