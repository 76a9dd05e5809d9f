"""Read back what the wandb client wrote for an offline run (no network, no wandb server).

wandb 0.31 no longer ships a Python reader for its `run-*.wandb` files. The format is a
LevelDB-style log (header ":W&B" + magic + version, 32 KiB blocks of records with a CRC,
a length and a FULL/FIRST/MIDDLE/LAST type) of `wandb_internal_pb2.Record` protobufs.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = struct.Struct("<4sHB")
RECORD = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> Iterator[bytes]:
    ident, _magic, _version = HEADER.unpack_from(data)
    assert ident == b":W&B", f"not a wandb run file ({ident!r})"
    pos, pending = HEADER.size, b""
    while pos + RECORD.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD.size:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = RECORD.unpack_from(data, pos)
        if length == 0 and kind == 0:
            pos += left
            continue
        payload = data[pos + RECORD.size:pos + RECORD.size + length]
        pos += RECORD.size + length
        if kind == FULL:
            yield payload
        elif kind == FIRST:
            pending = payload
        elif kind == MIDDLE:
            pending += payload
        elif kind == LAST:
            yield pending + payload
            pending = b""


def history_rows(wandb_dir: Path) -> list[dict[str, Any]]:
    """Every logged history row of the (one) offline run under `wandb_dir`."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    rows = []
    for raw in _payloads(path.read_bytes()):
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows
