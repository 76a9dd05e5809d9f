"""The 8-GPU simulated exposition, byte for byte (timing values normalised).

A change to names, labels, units, HELP text or ordering makes this fail, so it is a
deliberate decision that dashboards and rules are checked against. To regenerate after an
intended change:

    TRAINWATCH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/gpu/test_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.gpu.helpers import (
    make_loop,
    normalise,
    parse,
    render,
    render_via_registry,
    static_fake,
    value,
)
from trainwatch.exporters.contract import catalog as c

GOLDEN = Path(__file__).parent / "golden" / "simulated_8_gpus.prom"


def current_exposition() -> str:
    fake = static_fake(8)
    fake.update(lambda s: s["gpus"][3].update(
        not_supported=["nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetNvLinkState"],
        clock_event_reasons=0x20))
    fake.update(lambda s: s["gpus"][5].update(lost=True))
    fake.update(lambda s: s["gpus"][2].pop("gpm"))  # a GPU before Hopper: no GPM
    fake.update(lambda s: s["gpus"][4].update(errors={"nvmlGpmMetricsGet": "Unknown"}))
    # GPU 6 hit an uncorrectable memory error whose row could not be remapped: the sparse
    # error series (served from their first error) show up for it alone
    fake.update(lambda s: s["gpus"][6].update(
        ecc={"corrected_aggregate": 2, "uncorrected_volatile": 1, "uncorrected_aggregate": 1},
        remapped_rows=[0, 1, 0, 1]))
    loop = make_loop(fake)
    loop.run_once()
    loop.run_once()  # GPM values need two cycles' samples
    # What the XID thread records for two XID 79 events on GPU 1 (the thread itself is
    # exercised in test_background.py; here only the exposition format matters).
    loop.xid_counts.inc((loop.reader.identities[1], "79"), 2)
    return normalise(render(loop))


def test_simulated_8_gpu_exposition_matches_golden_file() -> None:
    text = current_exposition()
    if os.environ.get("TRAINWATCH_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    expected = GOLDEN.read_text()
    assert text == expected, (
        "exposition drifted from tests/gpu/golden/simulated_8_gpus.prom; if intended, "
        "regenerate with TRAINWATCH_UPDATE_GOLDEN=1 (see module docstring)")


def test_normalise_hides_only_timing_values() -> None:
    text = current_exposition()
    assert text.count("<normalised>") == 4
    assert "trainwatch_gpu_exporter_stale 0.0" in text


def test_cached_served_text_matches_a_plain_registry_render() -> None:
    fake = static_fake(8)
    loop = make_loop(fake)
    loop.run_once()
    served = parse(render(loop))
    plain = parse(render_via_registry(loop))
    volatile = {c.GPU_EXPORTER_DATA_AGE}
    assert {k: v for k, v in served.items() if k[0] not in volatile} == {
        k: v for k, v in plain.items() if k[0] not in volatile}
    loop.run_once()  # a new snapshot must not be served from the old cache
    fake.update(lambda s: s["gpus"][0].update(temperature=91))
    loop.run_once()
    assert value(parse(render(loop)), c.GPU_TEMPERATURE, gpu="0") == 91
