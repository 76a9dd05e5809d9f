"""In-band agreement: every rank applies the same commands, in the same order, at the same step.

Commands reach ranks at different times (each rank polls its own node's exporter; a command
may even be posted to one node only). If each rank applied a command when it saw it, replicas
would train with different learning rates for a few steps and silently diverge. Instead, at a
step boundary every K steps, all ranks exchange what they know over the job's own process
group and apply the union. The exchange is a collective, so it happens at the same step on
every rank by construction, and every rank computes the same ordered union from the same
gathered lists. Megatron-LM's signal handler uses the same all-gather-every-N-steps pattern.
"""

from __future__ import annotations

from typing import Any


def gather(known: list[dict[str, Any]], process_group: Any = None) -> list[list[dict[str, Any]]]:
    """What every rank knows, indexed by rank; just ours when not running distributed."""
    try:
        import torch.distributed as dist
    except ImportError:  # a job without torch: nothing to agree with
        return [known]
    if not (dist.is_available() and dist.is_initialized()):
        return [known]
    world = dist.get_world_size(process_group)
    if world == 1:
        return [known]
    gathered: list[Any] = [None] * world
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


def min_over_ranks(value: int | None, process_group: Any = None) -> int | None:
    """The smallest of every rank's value (None where a rank has none): one tiny all-reduce."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return value
    if not (dist.is_available() and dist.is_initialized()) or \
            dist.get_world_size(process_group) == 1:
        return value
    none = 2**62
    box = torch.tensor([none if value is None else int(value)], dtype=torch.int64)
    dist.all_reduce(box, op=dist.ReduceOp.MIN, group=process_group)
    return None if int(box.item()) == none else int(box.item())
