"""In-band agreement: every rank applies the same commands, in the same order, at the same step.

Commands reach ranks at different times (each rank polls its own node's exporter; a command
may even be posted to one node only). If each rank applied a command when it saw it, replicas
would train with different learning rates for a few steps and silently diverge. Instead, at a
step boundary every K steps, all ranks agree over the job's own process group and apply the
union. The agreement is a collective, so it happens at the same step on every rank by
construction, and every rank computes the same ordered union from the same gathered lists.
Megatron-LM's signal handler uses the same all-gather-every-N-steps pattern.

The common case is that nobody knows anything new, so a sync step is one fixed-size
all-reduce (MAX of the number of not-yet-applied commands each rank knows: one int64, two
with the first bad batch below, whatever the world size); only when that is non-zero do the
ranks exchange the commands themselves (`all_gather_object`). On a backend other than gloo
(NCCL) the all-reduce runs on a side gloo group over the same ranks, so the step gains no
host-device synchronisation (reading an NCCL result on the host would wait for the GPU
stream). Numbers: docs/performance.md ("Command agreement").

The same all-reduce carries one more int64: the earliest batch any rank saw a non-finite loss
at (`mark`, MIN as MAX of its negation), so every rank holds the same first bad batch and rank
0 can journal it (trainwatch.exporters.rank.train_state) without a collective of its own. Every
collective of the rollback path (`min_over_ranks`) runs on this object's group too: the side
gloo group on NCCL, where a CPU tensor on the job's own group would raise.

`Agreement` also counts its own collectives and records when it entered one (`seq`,
`since`): the shipper reports them, so a rank blocked elsewhere while its peers wait in the
agreement is visible from outside (trainwatch.exporters.rank.collectives adds PyTorch's flight
recorder when it is on).
"""

from __future__ import annotations

import time
from typing import Any

NONE = 2**62  # "no value" in a MIN over ranks (larger than any batch index)


def _distributed() -> Any:
    """torch.distributed when a process group is up; None otherwise (or without torch)."""
    try:
        import torch.distributed as dist
    except ImportError:  # a job without torch: nothing to agree with
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist


class Agreement:
    """The collectives the client runs on the job's group; create on every rank together.

    Construction may itself be a collective (`new_group` for the side gloo group), so every
    rank of the group must construct it at the same point, as the client's constructor does.
    """

    def __init__(self, process_group: Any = None) -> None:
        self.world = 1
        self.seq = 0  # collectives this object entered (same count on every rank)
        self.since: float | None = None  # wall time it entered the one it is in, else None
        self.side_group = False
        self.mark: int | None = None  # the earliest `mark` over ranks at the last exchange
        self._dist = None
        self._group = process_group
        self._src = 0
        dist = _distributed()
        if dist is None:
            return
        self.world = dist.get_world_size(process_group)
        if self.world == 1:
            return
        import torch

        self._dist = dist
        self._max = dist.ReduceOp.MAX
        if process_group is not None:
            self._src = dist.get_global_rank(process_group, 0)
        if "gloo" not in str(dist.get_backend(process_group)):
            ranks = (None if process_group is None
                     else dist.get_process_group_ranks(process_group))
            self._group = dist.new_group(ranks=ranks, backend="gloo")
            self.side_group = True
        self._flag = torch.zeros(2, dtype=torch.int64)
        try:  # a numpy view: element stores cost ~0.1 us where tensor indexing costs several
            self._view: Any = self._flag.numpy()
        except RuntimeError:  # torch without numpy
            self._view = self._flag

    def _enter(self) -> None:
        self.seq += 1
        self.since = time.time()

    def broadcast(self, value: Any) -> Any:
        """Group rank 0's `value` on every rank (used once, at start, for the job identity)."""
        if self._dist is None:
            return value
        box = [value]
        self._enter()
        try:
            self._dist.broadcast_object_list(box, src=self._src, group=self._group)
        finally:
            self.since = None
        return box[0]

    def exchange(self, known: list[dict[str, Any]],
                 mark: int | None = None) -> list[list[dict[str, Any]]]:
        """What every rank knows, by rank; [] when no rank knows anything (the common path).

        `mark` (a batch index or None) rides in the same all-reduce: afterwards `self.mark`
        is the smallest over ranks (None when no rank gave one).
        """
        if self._dist is None:
            self.mark = mark
            return [known] if known else []
        view = self._view
        view[0] = len(known)
        view[1] = -(NONE if mark is None else int(mark))  # MAX of -x is MIN of x
        self._enter()
        try:
            self._dist.all_reduce(self._flag, op=self._max, group=self._group)
            earliest = -int(view[1])
            self.mark = None if earliest >= NONE else earliest
            if int(view[0]) == 0:
                return []
            self.seq += 1
            gathered: list[Any] = [None] * self.world
            self._dist.all_gather_object(gathered, known, group=self._group)
            return gathered
        finally:
            self.since = None

    def min_over_ranks(self, values: list[int | None]) -> list[int | None]:
        """Each position's smallest value over ranks (None where no rank has one): one
        all-reduce on this object's group (the side gloo group on NCCL)."""
        if self._dist is None:
            return list(values)
        import torch

        box = torch.tensor([NONE if v is None else int(v) for v in values], dtype=torch.int64)
        self._enter()
        try:
            self._dist.all_reduce(box, op=self._dist.ReduceOp.MIN, group=self._group)
        finally:
            self.since = None
        return [None if int(v) >= NONE else int(v) for v in box.tolist()]


def gather(known: list[dict[str, Any]], process_group: Any = None) -> list[list[dict[str, Any]]]:
    """What every rank knows, by an unconditional `all_gather_object` (the former protocol,
    kept as the benchmark's reference)."""
    dist = _distributed()
    if dist is None or dist.get_world_size(process_group) == 1:
        return [known]
    gathered: list[Any] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(gathered, known, group=process_group)
    return gathered


def union(gathered: list[list[dict[str, Any]]], already_applied: set[str]) -> list[dict[str, Any]]:
    """Deterministic, id-deduplicated union: rank 0's commands first, each rank in its order.

    Every rank runs this on the same gathered lists, so every rank gets the same result; a
    command known to several ranks appears once, where its lowest rank listed it.
    """
    seen = set(already_applied)
    result = []
    for per_rank in gathered:
        for command in per_rank or []:
            command_id = command.get("id") if isinstance(command, dict) else None
            if isinstance(command_id, str) and command_id not in seen:
                seen.add(command_id)
                result.append(command)
    return result
