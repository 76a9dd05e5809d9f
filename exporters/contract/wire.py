"""The datagram a rank sends to its node exporter, and the exporter's check of it.

One JSON object per datagram. Counters (samples, tokens, non-finite losses, dropped samples,
commands applied) are cumulative, so a lost datagram loses no count: the next one that gets
through carries the total. Per-step values travel as short arrays to keep datagrams small.
Both ends are Python, so NaN/Infinity use Python's JSON spelling (a NaN loss must arrive as NaN).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract import goodput as gp
from trainwatch.exporters.contract.commands import COMMAND_ID_PATTERN, COMMAND_TYPE_PATTERN
from trainwatch.exporters.contract.identity import INCARNATION_PATTERN, is_job_name

VERSION = 1
MAX_DATAGRAM_BYTES = 60_000  # below the default Unix socket send buffer with room to spare
MAX_STEPS_PER_DATAGRAM = 200
MAX_APPLIED_PER_DATAGRAM = 50
MAX_COMMAND_TYPES = 32
# Index of each field inside one entry of "steps".
COLLECTIVE_SOURCES = ("agreement", "flight_recorder")
STEP_FIELDS = ("step", "time", "duration", "loss", "lr", "grad_norm", "data_wait")


class WireError(ValueError):
    """A datagram the exporter ignores (and counts as malformed)."""


@dataclass
class RankReport:
    """What one datagram says about one rank, validated."""

    job: str
    rank: int
    local_rank: int
    world_size: int
    restarts: int
    # The per-rank numbers of catalog.RANK_WIRE by metric name (samples, tokens, FLOPs, peak
    # FLOP/s, non-finite losses, dropped reports, rollbacks, failed checkpoint saves); a field
    # an older client omits reads 0.
    counters: dict[str, float]
    applied_counts: dict[str, int]
    command_types: dict[str, dict[str, Any]]
    cuda: tuple[float, float] | None
    # Which launch of the job this rank belongs to (rank 0's random id, shared by all ranks
    # of one launch; a restart or another world size brings a new one). "" from old clients.
    incarnation: str = ""
    finished: bool = False  # the rank closed its monitor: a clean end of the job
    # The collective the rank last entered: its sequence number on the job's group and, while
    # the rank is inside it, the wall time it entered (None outside); source "agreement"
    # (the client's own) or "flight_recorder" (PyTorch's, every collective).
    collective_seq: int | None = None
    collective_since: float | None = None
    collective_source: str = ""
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    applied: list[dict[str, Any]] = field(default_factory=list)
    # Which collective the rank is inside, on any process group (collectives.collective_key:
    # the same number on every rank inside the same one), 0 for none; older clients omit it.
    collective_key: int = 0
    # The rank's last datagram, sent as it ends without a clean finish (an exception, often a
    # collective that raised because a peer died); a killed rank never sends one.
    exiting: bool = False
    # Own compute time (step time minus waiting in collectives) of the steps measured so far,
    # and how many: cumulative (trainwatch.exporters.rank.collectives.OwnCompute); older clients
    # omit it.
    compute_seconds: float = 0.0
    compute_steps: int = 0
    # The rank's cumulative goodput seconds (exporters/contract/goodput.py); None from
    # clients that do not count them.
    goodput: gp.RankGoodput | None = None


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def _int(obj: dict[str, Any], key: str, low: int = 0, high: int = 2**62) -> int:
    value = obj.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise WireError(f"{key} must be an integer in [{low}, {high}]")
    return value


def _num(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise WireError(f"{key} must be a number")
    return float(value)


def _finite_nonneg(obj: dict[str, Any], key: str) -> float:
    value = _num(obj.get(key, 0), key) or 0.0
    if not math.isfinite(value) or value < 0:
        raise WireError(f"{key} must be finite and >= 0")
    return value


def decode(data: bytes) -> RankReport:
    """Parse and validate one datagram; raise WireError for anything off-contract."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # deep nesting: hostile
        raise WireError(f"not JSON: {type(exc).__name__}") from None
    if not isinstance(obj, dict) or obj.get("v") != VERSION:
        raise WireError("not a version-1 object")
    job = obj.get("job")
    if not is_job_name(job):
        raise WireError("bad job name")
    world_size = _int(obj, "world_size", 1, 1 << 20)
    rank = _int(obj, "rank", 0, world_size - 1)
    steps = obj.get("steps", [])
    if not isinstance(steps, list) or len(steps) > MAX_STEPS_PER_DATAGRAM:
        raise WireError("steps must be a short list")
    parsed_steps = []
    for entry in steps:
        if not isinstance(entry, list) or len(entry) != len(STEP_FIELDS):
            raise WireError("bad step entry")
        step = entry[0]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise WireError("step must be a non-negative integer")
        parsed_steps.append((step, *(_num(v, k) for k, v in zip(STEP_FIELDS[1:], entry[1:],
                                                                    strict=True))))
    applied_counts = obj.get("applied_counts", {})
    if not isinstance(applied_counts, dict) or len(applied_counts) > MAX_COMMAND_TYPES or any(
            not isinstance(k, str) or not COMMAND_TYPE_PATTERN.match(k)
            or not isinstance(v, int) or v < 0 for k, v in applied_counts.items()):
        raise WireError("bad applied_counts")
    command_types = obj.get("command_types", {})
    if not isinstance(command_types, dict) or len(command_types) > MAX_COMMAND_TYPES or any(
            not isinstance(k, str) or not COMMAND_TYPE_PATTERN.match(k)
            or not isinstance(v, dict) for k, v in command_types.items()):
        raise WireError("bad command_types")
    applied = obj.get("applied", [])
    if not isinstance(applied, list) or len(applied) > MAX_APPLIED_PER_DATAGRAM:
        raise WireError("bad applied list")
    for event in applied:
        if (not isinstance(event, dict) or not isinstance(event.get("id"), str)
                or not COMMAND_ID_PATTERN.fullmatch(event["id"])
                or not isinstance(event.get("type"), str)
                or not COMMAND_TYPE_PATTERN.match(event["type"])
                or not isinstance(event.get("args", {}), dict)
                or event.get("status") not in ("applied", "failed")):
            raise WireError("bad applied event")
        _int(event, "step")
    cuda = obj.get("cuda")
    if cuda is not None:
        if not isinstance(cuda, list) or len(cuda) != 2:
            raise WireError("cuda must be [allocated, reserved]")
        cuda = (_finite_nonneg({"a": cuda[0]}, "a"), _finite_nonneg({"r": cuda[1]}, "r"))
    incarnation = obj.get("incarnation", "")
    if not isinstance(incarnation, str) or not INCARNATION_PATTERN.match(incarnation):
        raise WireError("bad incarnation")
    finished = obj.get("finished", False)
    exiting = obj.get("exiting", False)
    if not isinstance(finished, bool) or not isinstance(exiting, bool):
        raise WireError("finished and exiting must be booleans")
    compute = obj.get("compute", [0.0, 0])
    if not isinstance(compute, list) or len(compute) != 2:
        raise WireError("compute must be [seconds, steps]")
    compute_seconds = _finite_nonneg({"compute": compute[0]}, "compute")
    compute_steps = _int({"steps": compute[1]}, "steps")
    collective = obj.get("collective")
    seq = since = None
    source = ""
    if collective is not None:
        if (not isinstance(collective, list) or len(collective) != 3
                or collective[2] not in COLLECTIVE_SOURCES):
            raise WireError("collective must be [seq, since, source]")
        seq = _int({"seq": collective[0]}, "seq")
        since = _num(collective[1], "since")
        if since is not None and (not math.isfinite(since) or since < 0):
            raise WireError("collective since must be a finite time")
        source = collective[2]
    try:
        goodput = gp.parse(obj.get("goodput"))
    except ValueError as exc:
        raise WireError(str(exc)) from None
    counters = {row.name: (_int(obj, row.wire) if row.wire_type is int
                           else _finite_nonneg(obj, row.wire)) for row in catalog.RANK_WIRE}
    return RankReport(
        goodput=goodput, job=job, rank=rank, local_rank=_int(obj, "local_rank", 0, 1 << 20),
        world_size=world_size, restarts=_int(obj, "restarts"), counters=counters,
        applied_counts=applied_counts, command_types=command_types, cuda=cuda,
        steps=parsed_steps, applied=applied, incarnation=incarnation,
        finished=finished, collective_seq=seq, collective_since=since,
        collective_source=source, collective_key=_int(obj, "collective_key", 0, 2**32),
        exiting=exiting, compute_seconds=compute_seconds, compute_steps=compute_steps)
