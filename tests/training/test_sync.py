"""The agreement's common path is one fixed-size all-reduce; objects move only with news.

Two real gloo ranks (torch.multiprocessing): the collective count per sync step is read from
`Agreement.seq` (one per collective entered) and from PyTorch's flight recorder, which logs
every collective the group runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from tests.support.net import free_port


def _rank(rank: int, port: int, out_dir: str) -> None:
    import os
    import time

    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace_json

    from trainwatch.exporters.rank import sync
    from trainwatch.exporters.rank.collectives import summarise

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="200")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    agreement = sync.Agreement()
    result: dict[str, Any] = {"quiet": [], "seq": []}
    for _ in range(3):
        result["quiet"].append(agreement.exchange([]))
        result["seq"].append(agreement.seq)
    known = [{"id": "c1", "type": "mark", "args": {}}] if rank == 1 else []
    result["news"] = agreement.exchange(known)
    result["seq"].append(agreement.seq)
    # The recorder retires an entry when the work object completes, which can trail the
    # collective's return on a busy machine: poll the dump until nothing is in flight.
    deadline = time.monotonic() + 20
    while True:
        entries = json.loads(_dump_fr_trace_json())["entries"]
        summary = summarise(entries)
        if summary[1] is None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    result["recorder"] = [e["profiling_name"] for e in entries]
    result["summary"] = list(summary)
    result["since"] = agreement.since
    Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_quiet_sync_steps_are_one_all_reduce_and_news_adds_one_exchange(tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    for result in results:
        assert result["quiet"] == [[], [], []]
        assert result["seq"] == [1, 2, 3, 5], "quiet: 1 collective; news: 1 + the exchange"
        assert [e["id"] for per_rank in result["news"] for e in per_rank] == ["c1"]
        assert result["recorder"][:3] == ["gloo:all_reduce"] * 3
        assert result["since"] is None, "outside a collective afterwards"
        seq, since, key = result["summary"]
        assert seq == len(result["recorder"]) and since is None and key == 0


class _FakeNcclDist:
    """Stands in for torch.distributed on an NCCL job (no GPUs here): records the groups
    the Agreement creates and the collectives it runs on which group. A fake, named so."""

    class ReduceOp:
        MAX = "max"

    def __init__(self) -> None:
        self.new_groups: list[dict[str, Any]] = []
        self.calls: list[tuple[str, Any]] = []

    def get_world_size(self, group: Any = None) -> int:
        return 4

    def get_backend(self, group: Any = None) -> str:
        return "nccl"

    def new_group(self, ranks: Any = None, backend: str | None = None) -> str:
        self.new_groups.append({"ranks": ranks, "backend": backend})
        return "side-gloo"

    def all_reduce(self, tensor: Any, op: Any = None, group: Any = None) -> None:
        self.calls.append(("all_reduce", group))


def test_on_nccl_the_agreement_runs_on_a_side_gloo_group(monkeypatch: Any) -> None:
    from trainwatch.exporters.rank import sync

    fake = _FakeNcclDist()
    monkeypatch.setattr(sync, "_distributed", lambda: fake)
    agreement = sync.Agreement()
    assert agreement.side_group and fake.new_groups == [{"ranks": None, "backend": "gloo"}]
    assert agreement.exchange([]) == []
    assert fake.calls == [("all_reduce", "side-gloo")], "the CPU flag never touches NCCL"
