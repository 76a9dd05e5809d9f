"""Encode Prometheus remote-write requests by hand (protobuf + snappy framing), for benchmarks.

The benchmark pushes a synthetic fleet's history into a real Prometheus through its
remote-write receiver, so the samples land in the head block as scraped samples do. Only the
few protobuf fields of `prometheus.WriteRequest` that carry float samples are written, and
the body is framed as one uncompressed snappy literal (valid snappy: the receiver decodes it
like any other; compressing would only cost time on both sides of a loopback socket), so no
protobuf or snappy package is needed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def labels(pairs: dict[str, str]) -> bytes:
    """TimeSeries.labels (field 1), sorted by name as the receiver expects."""
    return b"".join(_field(1, _field(1, k.encode()) + _field(2, v.encode()))
                    for k, v in sorted(pairs.items()))


def sample(value: float, timestamp_ms: int) -> bytes:
    """TimeSeries.samples (field 2): Sample{double value = 1; int64 timestamp = 2}."""
    return _field(2, b"\x09" + struct.pack("<d", value) + b"\x10" + varint(timestamp_ms))


def timeseries(encoded_labels: bytes, encoded_samples: bytes) -> bytes:
    """WriteRequest.timeseries (field 1) from pre-encoded labels and samples."""
    return _field(1, encoded_labels + encoded_samples)


def snappy_literal(body: bytes) -> bytes:
    """Snappy block format holding `body` as a single literal: uncompressed length, then a
    literal tag with a 4-byte length (tag 63 << 2), then the bytes."""
    return varint(len(body)) + b"\xfc" + struct.pack("<I", len(body) - 1) + body


def request(series: Iterable[bytes]) -> bytes:
    """The HTTP body of one remote-write request from encoded `timeseries` fields."""
    return snappy_literal(b"".join(series))
