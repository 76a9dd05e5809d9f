"""Prometheus text exposition (format 0.0.4) for gauges and counters, without prometheus_client.

Why not prometheus_client here: importing it (its package `__init__` always loads its HTTP
exposition module, which pulls in `ssl`, `http.server`, `email`, `wsgiref`) costs the
exporter about 10 MiB of RSS, more than everything else it adds to the interpreter and
NVML (benchmarks/gpu_exporter.py, docs/performance.md). The exporter only ever emits gauges
and counters with string labels, which is a few lines of text formatting. The output is
byte-for-byte what prometheus_client's `generate_latest` writes for the same families
(labels sorted by name, Go-style floats, the same escaping); tests/gpu/test_golden.py
checks that against prometheus_client itself. `Family` offers the attributes
`generate_latest` reads (`name`, `type`, `documentation`, `samples`), so a test can hand
the same objects to both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None  # never set here; generate_latest reads it


class Family:
    """One metric family: a gauge or a counter (counter names lose `_total`, samples add it)."""

    __slots__ = ("_labels", "_sample_name", "documentation", "name", "samples", "type")

    def __init__(self, name: str, documentation: str, kind: str,
                 labels: Sequence[str] = (), value: float | None = None) -> None:
        if kind not in ("gauge", "counter"):
            raise ValueError(f"unsupported metric type {kind!r}")
        if kind == "counter":
            name = name.removesuffix("_total")
        self.name = name
        self.type = kind
        self.documentation = documentation
        self.samples: list[Sample] = []
        self._labels = tuple(labels)
        self._sample_name = name + "_total" if kind == "counter" else name
        if value is not None:
            self.samples.append(Sample(self._sample_name, {}, value))

    def add_metric(self, label_values: Sequence[str], value: float) -> None:
        labels = dict(zip(self._labels, label_values, strict=True))
        self.samples.append(Sample(self._sample_name, labels, value))


def gauge(name: str, documentation: str, labels: Sequence[str] = (),
          value: float | None = None) -> Family:
    return Family(name, documentation, "gauge", labels, value)


def counter(name: str, documentation: str, labels: Sequence[str] = (),
            value: float | None = None) -> Family:
    return Family(name, documentation, "counter", labels, value)


def go_float(value: float) -> str:
    """A float as Go's strconv formats it (what Prometheus and prometheus_client write)."""
    value = float(value)
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render(families: Iterable[Family]) -> bytes:
    """The families as exposition text, UTF-8."""
    out: list[str] = []
    for family in families:
        exposed = family.name + "_total" if family.type == "counter" else family.name
        help_text = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {exposed} {help_text}\n# TYPE {exposed} {family.type}\n")
        for sample in family.samples:
            if sample.labels:
                labels = ",".join(f'{k}="{_escape_value(v)}"'
                                  for k, v in sorted(sample.labels.items()))
                out.append(f"{sample.name}{{{labels}}} {go_float(sample.value)}\n")
            else:
                out.append(f"{sample.name} {go_float(sample.value)}\n")
    return "".join(out).encode("utf-8")
