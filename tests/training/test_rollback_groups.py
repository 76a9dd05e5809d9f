"""Issue 28, point 8: no collective of the rollback path runs on the job's own group.

On an NCCL job a CPU tensor on the job's own (NCCL) group raises, so every collective of the
command path, the rollback included, must run on the Agreement's side gloo group or the
checkpoint manager's own gloo group. A gloo-only job cannot catch a slip by running (gloo
takes CPU tensors on any group), so this test inspects instead: two real gloo ranks, the
Agreement told the job's group is NCCL (so it makes its side gloo group, as on a GPU
cluster), and every torch.distributed collective recorded with the group it ran on while a
rollback with a skip is agreed and applied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

from tests.support.net import free_port

pytestmark = pytest.mark.slow

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_object",
               "broadcast_object_list", "gather_object", "scatter_object_list", "barrier",
               "reduce", "gather", "scatter", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single")


def _rank(rank: int, port: int, out_dir: str) -> None:
    import os

    import torch
    import torch.distributed as dist

    from trainwatch.exporters.contract.launcher import RankInfo
    from trainwatch.exporters.rank import sync
    from trainwatch.exporters.rank.checkpoint import CheckpointManager
    from trainwatch.exporters.rank.client import TrainingMonitor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)

    class NcclView:
        """torch.distributed as an NCCL job's Agreement sees it: the job's group says nccl."""

        def __getattr__(self, name: str) -> Any:
            return getattr(dist, name)

        def get_backend(self, group: Any = None) -> str:
            if group is None or group is dist.group.WORLD:
                return "nccl"
            return dist.get_backend(group)

    view = NcclView()
    sync._distributed = lambda: view  # type: ignore[assignment]
    calls: list[tuple[str, Any, bool]] = []
    recording = [False]

    def recorder(name: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if recording[0]:
                tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
                calls.append((name, kwargs.get("group"), any(t.device.type == "cpu"
                                                             for t in tensors)))
            return original(*args, **kwargs)
        return call

    for name in COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, recorder(name, getattr(dist, name)))

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    manager = CheckpointManager(Path(out_dir) / "ckpt", model, optimizer)
    monitor = TrainingMonitor(rank_info=RankInfo("groups-job", rank, rank, 2, 0),
                              optimizer=optimizer, checkpoints=manager, socket_path=None,
                              control=False, sync_every=1, flush_interval=0.01)
    assert monitor._agreement.side_group, "the Agreement took the job's group for NCCL"
    result: dict[str, Any] = {}
    for step in range(5):
        batch = monitor.next_batch()
        loss = model(torch.randn(8, 4, generator=torch.Generator().manual_seed(batch))
                     ).pow(2).mean()
        if step == 3 and rank == 1:
            loss = loss * float("nan")  # one rank's bad data
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        monitor.report(step, loss=loss.detach())
        if step == 2:
            manager.save(step, loss=float(loss))
        if step == 4:
            monitor._incoming.append({"id": "rb", "type": "rollback",
                                      "args": {"skip_batches": 2}})
            recording[0] = True
        control = monitor.step_end(step)
        recording[0] = False
        if control.applied:
            result["event"] = control.applied[0]
    groups = {id(monitor._agreement._group): "agreement side group",
              id(manager._group): "checkpoint group"}

    def name_of(group: Any) -> str:
        if group is None or group is dist.group.WORLD:
            return "job group"
        return groups.get(id(group), "other group")

    result["calls"] = [[name, name_of(group), cpu] for name, group, cpu in calls]
    monitor.close()
    manager.close()
    Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_every_rollback_collective_runs_off_the_jobs_own_group(tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in (0, 1):
        result = json.loads((tmp_path / f"{rank}.json").read_text())
        event = result["event"]
        assert event["status"] == "applied", event
        assert event["result"]["skipped"] == [3, 5], "rank 1's bad batch, agreed by both"
        calls = result["calls"]
        on_job = [c for c in calls if c[1] == "job group"]
        assert not on_job, f"rank {rank}: collectives on the job's own group: {on_job}"
        where = {c[1] for c in calls}
        assert "agreement side group" in where and "checkpoint group" in where, calls
