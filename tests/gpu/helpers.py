"""Shared pieces for the GPU exporter tests (fake NVML: there is no GPU on this machine)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainwatch.exporters.node.gpu.collector_loop import CollectionLoop
from trainwatch.exporters.node.gpu.exposition import GpuCollector
from trainwatch.exporters.node.gpu.fake_nvml import FakeNvml, simulated_scenario
from trainwatch.exporters.node.gpu.http_server import ExpositionApp
from trainwatch.exporters.node.gpu.processes import ProcessAttributor, read_proc_environ

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def make_loop(fake: FakeNvml, *, interval: float = 1.0, deadline: float | None = None,
              watch_xid: bool = False) -> CollectionLoop:
    def environ(pid: int) -> dict[str, str] | None:
        return fake.process_environ(pid) or read_proc_environ(pid)

    return CollectionLoop(fake, interval=interval, deadline=deadline,
                          attributor=ProcessAttributor(environ), watch_xid=watch_xid)


def registry_for(loop: CollectionLoop, simulated: bool = True) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(loop, simulated))
    return registry


def parse(text: str) -> Series:
    """Every sample as (name, labels) -> value; fails on NaN (errors must never look like data)."""
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert not math.isnan(sample.value), f"NaN exported for {sample.name}"
            series[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return series


def render(loop: CollectionLoop) -> str:
    """Exactly the bytes the exporter serves (cached snapshot text + live series)."""
    return ExpositionApp(GpuCollector(loop, True), process_metrics=False).render().decode()


def render_via_registry(loop: CollectionLoop) -> str:
    """The same families through a plain prometheus_client registry (no caching)."""
    return generate_latest(registry_for(loop)).decode()


def values(series: Series, name: str, **labels: str) -> list[float]:
    """Values of `name` whose labels include `labels`."""
    want = set(labels.items())
    return [v for (n, lbls), v in series.items() if n == name and want <= lbls]


def value(series: Series, name: str, **labels: str) -> float:
    found = values(series, name, **labels)
    assert len(found) == 1, f"expected one {name}{labels}, found {found}"
    return found[0]


def static_fake(gpus: int) -> FakeNvml:
    """Simulated GPUs whose values do not drift (deterministic assertions, golden file)."""
    return FakeNvml(simulated_scenario(gpus, dynamic=False))


_VOLATILE = re.compile(
    r"^(trainwatch_gpu_exporter_(?:collection_duration_seconds|last_success_timestamp_seconds|"
    r"data_age_seconds|gpm_duration_seconds)) \S+$", re.M)


def normalise(text: str) -> str:
    """Replace timing values that differ between runs with a placeholder."""
    return _VOLATILE.sub(r"\1 <normalised>", text)


@contextmanager
def started(loop: CollectionLoop) -> Iterator[CollectionLoop]:
    loop.start()
    try:
        yield loop
    finally:
        loop.stop(timeout=2.0)
