"""Every series the exporter serves is named in exporters/catalog.py, and vice versa."""

from __future__ import annotations

from exporters import catalog
from exporters.gpu import metrics as m
from exporters.gpu.exposition import HELP
from tests.gpu.helpers import make_loop, parse, render, static_fake


def test_served_names_and_catalog_agree() -> None:
    fake = static_fake(2)
    devices = [{"uuid": "MIG-0", "memory_total": 2**30, "memory_used": 0}]
    fake.update(lambda s: s["gpus"][0].update(mig={"enabled": True, "devices": devices}))
    loop = make_loop(fake, watch_xid=False)
    loop.run_once()
    loop.run_once()  # GPM values need two cycles
    loop.xid_counts.inc((loop.reader.identities[0], "79"))
    loop.errors.inc(("nvmlDeviceGetPowerUsage", "Unknown"))
    served = {name for name, _ in parse(render(loop))}
    catalog_names = {value for key, value in vars(catalog).items()
                     if key.startswith("GPU_") and isinstance(value, str)
                     and value.startswith(catalog.GPU_PREFIX) and not value.endswith("_")}
    assert served == catalog_names == set(m.ALL_METRICS)
    assert set(HELP) == set(m.ALL_METRICS)
