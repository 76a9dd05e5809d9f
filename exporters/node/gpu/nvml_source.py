"""Which NVML the exporter talks to: the real pynvml, or the fake for tests and `--simulate`.

Kept apart from exporters/node/gpu/fake_nvml.py so that a real host never imports the fake (about
1.7 MiB of the exporter's RSS with the json/tempfile/queue modules it uses): the fake is
imported only when $TRAINWATCH_FAKE_NVML or `--simulate` asks for it. The fake imports nothing
from here (no import cycle); its ScenarioError is exporters/node/gpu/config.py's.
"""

from __future__ import annotations

import os
from typing import Any

import pynvml

ENV_FAKE_NVML = "TRAINWATCH_FAKE_NVML"


def load_nvml(simulate: int | None = None) -> tuple[Any, bool]:
    """(nvml, simulated): the fake from $TRAINWATCH_FAKE_NVML or `--simulate N`, else pynvml."""
    path = os.environ.get(ENV_FAKE_NVML)
    if not path and not simulate:
        return pynvml, False
    from trainwatch.exporters.node.gpu.fake_nvml import FakeNvml, simulated_scenario

    if path:
        return FakeNvml.from_file(path), True
    return FakeNvml(simulated_scenario(simulate or 0)), True
