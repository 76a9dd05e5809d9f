"""Checkpoint manager on torch.distributed.checkpoint: sharded, asynchronous, committed atomically.

One component owns checkpointing (torchtitan's shape): the loop calls `save(step)` and, when
told to, `rollback()`; everything else is here.

Layout of the checkpoint directory (one directory shared by every rank: see docs/training.md):

    manifest.json                   {"version": 2, "checkpoints": [{"step", "dir", "loss",
                                     "healthy", "world_size", "time"}, ...]}   (oldest first)
    effects.json                    command effects journalled as they are agreed (train_state)
    lineage/rank-<r>.json           each rank's record of itself, for goodput across nodes
                                     (exporters/rank/lineage.py)
    step-0000000120-9f2c41d07a3be512-3/   one checkpoint (run id agreed at start, save number)
        .metadata, __<rank>_0.distcp   DCP: every rank writes its own shards
        rng-rank<r>.json            every rank's RNG state, written by that rank
        job.json                    step, scheduler, GradScaler, TrainState (rank 0)
        COMMITTED                   written last, by rank 0, after every rank reported success

The state dict comes from torch.distributed.checkpoint.state_dict.get_state_dict, which
handles DDP, FSDP2 and DTensor-sharded models alike, so a checkpoint saved by 4 ranks loads
on 2 (DCP reshards on load). A checkpoint counts only once it is committed: DCP's own finish
step gathers every rank's write result before rank 0 writes the metadata; then every rank
contributes (wrote my part, my losses were finite) to an all-reduce, and only when all ranks
succeeded does rank 0 write COMMITTED and then name the checkpoint in the manifest. A crash
anywhere before that leaves the previous manifest in force; leftovers are removed at start.

Asynchronous saves (the default) copy the state to CPU memory (in the background when there
is an optimizer: its next step waits for the copy) and save that copy from a background
thread over a process group of their own, so the save never interleaves with the training
job's collectives; the shard files themselves are written by a writer process
(checkpoint_writer.py), so serialising and writing them takes neither the training
process's GIL nor its CPU time (`writer="thread"` writes them on that thread instead). At most one
save is in flight: the next save, a rollback or `close()` waits for it. The CPU copy is kept
between saves (one extra copy of this rank's state in host memory, as torchtitan keeps). A
failed background write leaves that checkpoint out of the manifest and is logged and counted
(`failed_saves`).

Rollback is one decision: rank 0 picks the checkpoint and broadcasts it; every rank loads it
into a scratch copy; an all-reduce of success decides; only if every rank read its part does
any rank change its live state. Otherwise every rank raises RollbackFailed and trains on, in
step, from where it was.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import random
import secrets
import shutil
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from trainwatch.exporters.contract.atomic_file import atomic_write
from trainwatch.exporters.rank import lineage
from trainwatch.exporters.rank import train_state as ts
from trainwatch.exporters.rank.checkpoint_writer import WriterError, WriterProcess, shared_writer
from trainwatch.exporters.rank.counters import RankCounters
from trainwatch.exporters.rank.goodput import RESTORE, SAVE, blocking
from trainwatch.exporters.rank.serial_thread import SerialThread

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
COMMITTED = "COMMITTED"
JOB_FILE = "job.json"
PROBE_PREFIX = ".layout-probe-"
# Where an asynchronous save's shards are written: a writer process of its own (default; see
# checkpoint_writer.py) or a thread of the training process.
WRITERS = ("process", "thread")
# When an asynchronous save copies the state: in the background, the next optimizer.step()
# waiting for the copy ("background"), or before save() returns ("on_save"). See
# docs/training.md "What an asynchronous checkpoint holds".
STAGING = ("background", "on_save")
# DCP's CheckpointException derives from BaseException: name it wherever failures are caught.


class NoHealthyCheckpoint(RuntimeError):
    """Rollback was asked for but the manifest has no healthy checkpoint."""


class RollbackFailed(RuntimeError):
    """Some rank could not read the chosen checkpoint; no rank changed its state."""


class CheckpointLayoutError(RuntimeError):
    """The checkpoint directory is not one directory shared by every rank."""


@dataclass
class Restored:
    """What a rollback or resume restored."""

    step: int
    directory: str
    train_state: ts.TrainState


# --- digests ---------------------------------------------------------------------------------
def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    tensor = tensor.detach().cpu().contiguous()
    return tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""


def weights_digest(model: torch.nn.Module | dict[str, Any]) -> str:
    """SHA-256 over a model's (or state dict's) full tensors in key order.

    Equal iff bit-identical. For a sharded model (FSDP2, DTensor) this is a collective: it
    gathers the full parameters, so every rank must call it.
    """
    if isinstance(model, dict):
        state = model
    else:
        sharded = any(hasattr(p, "full_tensor") for p in model.parameters())
        state = (get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
                 if sharded else _unwrap(model).state_dict())
    digest = hashlib.sha256()
    for key in sorted(state):
        value = state[key]
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        digest.update(key.encode())
        digest.update(_tensor_bytes(value))
    return digest.hexdigest()


def shard_digest(model: torch.nn.Module) -> str:
    """SHA-256 over this rank's own part of the weights (its local shards of sharded
    parameters, the whole tensor otherwise); not a collective."""
    digest = hashlib.sha256()
    for key, value in sorted(_unwrap(model).state_dict().items()):
        local = value.to_local() if hasattr(value, "to_local") else value
        digest.update(key.encode())
        digest.update(_tensor_bytes(local))
    return digest.hexdigest()


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """DistributedDataParallel and similar wrappers keep the real model in `.module`."""
    return getattr(model, "module", model)


# --- RNG -------------------------------------------------------------------------------------
def _rng_state() -> dict[str, Any]:
    """This rank's RNG states as JSON values (bytes as base64)."""
    kind, keys, pos, has_gauss, gauss = numpy.random.get_state()
    version, internal, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": base64.b64encode(_tensor_bytes(torch.get_rng_state())).decode(),
        "python": [version, list(internal), py_gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [base64.b64encode(_tensor_bytes(t)).decode()
                         for t in torch.cuda.get_rng_state_all()]
    return state


def _tensor(encoded: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(encoded)), dtype=torch.uint8)


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(_tensor(state["torch"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, gauss_np = state["numpy"]
    numpy.random.set_state((kind, numpy.array(keys, dtype=numpy.uint32), pos, has_gauss,
                            gauss_np))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_tensor(b) for b in state["cuda"]])


def _clone(value: Any) -> Any:
    """A detached copy of a (nested) state dict: the scratch target a rollback loads into."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


def _describe(exc: BaseException) -> str:
    """One line per failing rank: DCP's CheckpointException carries each rank's exception and
    its traceback, whose text would bury the cause."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        causes = []
        for rank, failure in sorted(failures.items()):
            inner = failure[0] if isinstance(failure, tuple) and failure else failure
            causes.append(f"rank {rank}: {type(inner).__name__}: {inner}")
        return "; ".join(causes)[:500]
    return f"{type(exc).__name__}: {exc}"[:500]


def _step_hook_target(optimizer: Any) -> Any:
    """The torch optimizer under framework wrappers (accelerate's AcceleratedOptimizer in the
    Hugging Face Trainer, Lightning's LightningOptimizer keep it in `.optimizer`): the one
    whose `step()` changes the weights and that takes a step pre-hook. AcceleratedOptimizer
    subclasses torch's Optimizer without running its constructor (no hook table), so the
    innermost one is taken. None if there is no torch optimizer inside."""
    for _ in range(8):
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner
    if isinstance(optimizer, torch.optim.Optimizer) and \
            hasattr(optimizer, "_optimizer_step_pre_hooks"):
        return optimizer
    return None


def _nonfinite_weights(state: dict[str, Any]) -> list[str]:
    """Names of floating-point tensors holding NaN or Inf (this rank's local shards)."""
    bad = []
    for key, value in state.items():
        if hasattr(value, "to_local"):
            value = value.to_local()
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() \
                and not bool(torch.isfinite(value).all()):
            bad.append(key)
    return bad


def _finite(loss: Any) -> bool:
    if loss is None:
        return True
    try:
        return math.isfinite(float(loss))
    except (TypeError, ValueError, RuntimeError):
        return True


class _OffloadedWriter(FileSystemWriter):
    """DCP's FileSystemWriter whose write_data runs in the writer process: the plan, the
    collectives and the metadata stay with DCP in this process, unchanged."""

    def __init__(self, path: Path, process: WriterProcess, owner: int) -> None:
        super().__init__(path)
        self._process = process
        self._owner = owner

    def write_data(self, plan: Any, planner: Any) -> torch.futures.Future[Any]:
        items = {item.index: planner.resolve_data(item) for item in plan.items}
        options = {"sync_files": self.sync_files, "thread_count": self.thread_count,
                   "single_file_per_rank": self.single_file_per_rank}
        done: torch.futures.Future[Any] = torch.futures.Future()
        done.set_result(self._process.write(self._owner, str(self.path), plan, items, options))
        return done


class CheckpointManager:
    """Saves and restores the whole training state of every rank of a job.

    `model` may be plain, DDP-wrapped, FSDP2-sharded or hold DTensor parameters. `scaler` is
    a torch.amp.GradScaler; `data` anything with state_dict()/load_state_dict() (a stateful
    data loader or sampler) whose state rides in the job file. `asynchronous` saves in the
    background (see the module docstring). Create it on every rank, after init_process_group;
    the constructor is collective (it checks that every rank sees the same directory).
    """

    def __init__(self, directory: str | Path, model: torch.nn.Module, optimizer: Any = None,
                 scheduler: Any = None, *, scaler: Any = None, data: Any = None, keep: int = 3,
                 asynchronous: bool = True, writer: str = "process",
                 staging: str = "background", process_group: Any = None) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        if writer not in WRITERS:
            raise ValueError(f"writer must be one of {WRITERS}, not {writer!r}")
        if staging not in STAGING:
            raise ValueError(f"staging must be one of {STAGING}, not {staging!r}")
        self.directory = Path(directory)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.data = data
        self.keep = keep
        self.asynchronous = asynchronous
        self.state = ts.TrainState()
        self.health: Callable[[], bool] | None = None  # set by TrainingMonitor
        # Called when a timed save or restore ends (goodput.blocking), so the monitor ships
        # the new checkpoint mark at once, not a step later (set by TrainingMonitor).
        self.goodput_wake: Callable[[], None] | None = None
        # Failed saves are counted here; a TrainingMonitor given this manager reports these
        # counters (it adopts them as its own), so its datagrams carry them.
        self.counters = RankCounters()
        self.last_failure: str | None = None
        self._distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(process_group) if self._distributed else 0
        self.world_size = dist.get_world_size(process_group) if self._distributed else 1
        self._saves = 0
        self._lock = threading.Lock()  # manifest updates (committer thread vs training thread)
        self._inflight: Future[Any] | None = None
        # the background half of every asynchronous save runs on this one thread, started
        # here rather than at each save (see serial_thread)
        self._committer = SerialThread("trainwatch-checkpoint-commit")
        # a manager dropped without close() lets its thread end too (the thread holds no
        # reference to the manager, only to the calls queued on it)
        weakref.finalize(self, self._committer.close)
        # One stager for the manager's life: it keeps the CPU copy's storage and copies into
        # it again at the next save (a fresh one per save pays allocation and page faults on
        # every save). Reuse is safe because a save waits for the one before it.
        # With an optimizer, the copy itself runs in the background too (DCP's async
        # staging): the weights only change in optimizer.step(), and a step pre-hook waits for
        # the copy there, so the loop's forward and backward overlap it (torchtitan's pinned
        # memory path does the same with the device-to-host copy).
        # With the process writer the copy lives in shared memory, which the writer process
        # maps once and reads at every save (no second copy).
        # Under a framework's optimizer wrapper the hook goes on the torch optimizer inside;
        # an optimizer with no torch optimizer inside gets the copy before save() returns.
        hook_target = _step_hook_target(optimizer)
        self._async_staging = (asynchronous and staging == "background"
                               and hook_target is not None)
        self._writer: WriterProcess | None = (shared_writer() if asynchronous
                                              and writer == "process" else None)
        self._stager = (DefaultStager(StagingOptions(False, self._writer is not None,
                                                     self._async_staging, False))
                        if asynchronous else None)
        self._staging: Future[Any] | None = None
        if self._stager is not None:
            self._committer.start()
        if self._async_staging:
            hook_target.register_step_pre_hook(lambda *_: self.wait_staged())
        # DCP's collectives (and the commit all-reduce) run on a group of their own, so a
        # background write never interleaves with the training job's collectives.
        self._group = (dist.new_group(backend="gloo") if self._distributed
                       and self.world_size > 1 else None)
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
        # A run id agreed at start names this run's checkpoints, so a relaunched job never
        # writes into a directory an earlier run committed (and the manifest still names).
        self._run_id = self._check_layout()
        # The slot's rank in the incarnation before this one (goodput across nodes,
        # exporters/rank/lineage.py): read before the barrier, so before any rank of this
        # incarnation can have rewritten a record.
        self.predecessor = lineage.read_predecessor(self.directory, self.rank)
        if self.rank == 0:
            self._remove_uncommitted()
        self._barrier()
        self.state.merge_effects(ts.read_effects(self.directory))
        if self._writer is not None:
            # Warm before the first step: the writer's start-up (importing torch, seconds of
            # a core at idle priority) runs while the job is still setting up, never beside
            # its first steps. A writer that cannot start fails its saves, reported there.
            try:
                self._writer.ensure_ready()
            except WriterError as exc:
                log.error("checkpoint writer process did not start: %s", exc)

    # --- collectives (training thread, only while nothing is in flight) ---------------------
    @property
    def failed_saves(self) -> int:
        """Saves that failed on this rank (not eligible for rollback), since the start."""
        return self.counters.checkpoint_failures

    @property
    def _multi(self) -> bool:
        return self._group is not None

    def _barrier(self) -> None:
        if self._multi:
            dist.barrier(group=self._group)

    def _all_ok(self, ok: bool) -> bool:
        if not self._multi:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._group)
        return bool(flag.item())

    def _all_ok_pair(self, first: bool, second: bool) -> tuple[bool, bool]:
        """Both flags AND-ed over ranks in one all-reduce (on the manager's own group)."""
        if not self._multi:
            return first, second
        flags = torch.tensor([int(first), int(second)], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self._group)
        return bool(flags[0]), bool(flags[1])

    def _from_rank0(self, value: Any) -> Any:
        if not self._multi:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self._group, 0),
                                   group=self._group)
        return box[0]

    def _check_layout(self) -> str:
        """Refuse a directory that is not the same for every rank (node-local, per-rank);
        returns the token rank 0 chose (the run id)."""
        token = self._from_rank0(secrets.token_hex(8) if self.rank == 0 else None)
        probe = self.directory / f"{PROBE_PREFIX}{token}"
        if self.rank == 0:
            probe.write_text(token)
        self._barrier()
        try:
            ok = probe.read_text() == token
        except OSError:
            ok = False
        shared = self._all_ok(ok)
        if self.rank == 0:
            probe.unlink(missing_ok=True)
        if not shared:
            raise CheckpointLayoutError(
                f"checkpoint directory {self.directory} is not shared by all "
                f"{self.world_size} ranks (rank {self.rank} "
                f"{'sees' if ok else 'does not see'} rank 0's files). Use one directory on a "
                "filesystem every node mounts (NFS, Lustre, GPFS...); node-local checkpoint "
                "directories are not supported (docs/training.md)")
        return token

    def _remove_uncommitted(self) -> None:
        """Checkpoint directories the manifest does not name are leftovers of killed saves."""
        named = {e["dir"] for e in self.manifest()}
        for path in self.directory.glob("step-*"):
            if path.is_dir() and path.name not in named:
                shutil.rmtree(path, ignore_errors=True)
        for leftover in [*self.directory.glob(".*.tmp"),
                         *(self.directory / lineage.DIRECTORY).glob(".*.tmp")]:
            leftover.unlink(missing_ok=True)

    # --- manifest ---------------------------------------------------------------------------
    def manifest(self) -> list[dict[str, Any]]:
        """Committed checkpoints, oldest first; an absent manifest is an empty list."""
        try:
            data = json.loads((self.directory / MANIFEST).read_text())
        except FileNotFoundError:
            return []
        entries = data.get("checkpoints", []) if isinstance(data, dict) else []
        return [e for e in entries if isinstance(e, dict) and isinstance(e.get("step"), int)
                and isinstance(e.get("dir"), str)]

    def _write_manifest(self, entries: list[dict[str, Any]]) -> None:
        body = json.dumps({"version": 2, "checkpoints": entries}, indent=1).encode()
        atomic_write(self.directory / MANIFEST, lambda f: f.write(body))

    def newest_healthy(self, before_step: int | None = None) -> dict[str, Any] | None:
        return self._newest_healthy_except(before_step, [])

    def _newest_healthy_except(self, before_step: int | None,
                               refused: list[str]) -> dict[str, Any] | None:
        healthy = [e for e in self.manifest() if e.get("healthy") and e["dir"] not in refused
                   and (before_step is None or e["step"] <= before_step)]
        return max(healthy, key=lambda e: (e["step"], e.get("time", 0))) if healthy else None

    def _mark_unhealthy(self, name: str) -> None:
        """Rank 0: the manifest no longer offers this checkpoint as a rollback target."""
        with self._lock:
            entries = self.manifest()
            for entry in entries:
                if entry["dir"] == name:
                    entry["healthy"] = False
                    entry["refused"] = "non-finite weights"
            self._write_manifest(entries)

    def _retain(self, entries: list[dict[str, Any]]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(kept, dropped): the newest `keep` plus the newest healthy one, so a run of
        unhealthy saves after a NaN can never push the last good state out."""
        kept = entries[-self.keep:]
        healthy = [e for e in entries if e.get("healthy")]
        if healthy and healthy[-1] not in kept:
            kept = [healthy[-1], *kept]
        return kept, [e for e in entries if e not in kept]

    # --- save -------------------------------------------------------------------------------
    def _state_dict(self) -> dict[str, Any]:
        if self.optimizer is not None:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            return {"model": model_sd, "optim": optim_sd}
        return {"model": get_model_state_dict(self.model)}

    def _job_document(self, step: int, next_batch: int | None) -> dict[str, Any]:
        if self.data is not None:
            self.state.loader = self.data.state_dict()
        train_state = self.state.to_json()
        if next_batch is not None:
            train_state["next_batch"] = next_batch
        return {"step": step,
                "scheduler": self.scheduler.state_dict() if self.scheduler else None,
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "train_state": train_state}

    @blocking(SAVE)  # goodput: the training thread waits here
    def save(self, step: int, loss: Any = None, healthy: bool | None = None,
             next_batch: int | None = None) -> str:
        """Checkpoint the state after `step` completed. Collective: call on every rank.

        Healthy (a rollback target) unless told otherwise, or any rank's `loss` (float,
        tensor or numpy scalar) is non-finite, or the attached monitor saw a non-finite loss
        since the previous save. `next_batch` overrides the saved data position when the
        loader fetched ahead of training (the oldest batch fetched but not yet trained on).
        Returns the checkpoint's directory name; with asynchronous saves it is committed
        later (see `wait`).
        """
        self.wait()
        mine_healthy = _finite(loss) if healthy is None else bool(healthy)
        if healthy is None and self.health is not None:
            mine_healthy = self.health() and mine_healthy
        name = f"step-{step:010d}-{self._run_id}-{self._saves}"
        self._saves += 1
        target = self.directory / name
        job = self._job_document(step, next_batch)
        rng = _rng_state()
        loss_value = float(loss) if loss is not None and _finite(loss) else None
        entry = {"step": step, "dir": name, "loss": loss_value, "world_size": self.world_size}
        state = self._state_dict()
        if self._stager is not None:
            staged = self._stager.stage(state)
            if isinstance(staged, Future):
                self._staging = staged
            self._inflight = self._committer.submit(
                self._finish, lambda: self._write_staged(staged, target), target, job, rng,
                entry, mine_healthy)
        else:
            self._finish(lambda: dcp.save(state, checkpoint_id=str(target),
                                          process_group=self._group),
                         target, job, rng, entry, mine_healthy)
        return name

    def _write_staged(self, staged: Any, target: Path) -> None:
        """The background half of an asynchronous save: DCP's save of the staged copy, its
        planning and collectives here, the shard write in the writer process (or here)."""
        state = staged.result() if isinstance(staged, Future) else staged
        storage = (_OffloadedWriter(target, self._writer, id(self)) if self._writer is not None
                   else FileSystemWriter(target))
        dcp.save(state, storage_writer=storage, process_group=self._group)

    def _finish(self, write: Callable[[], Any], target: Path, job: dict[str, Any],
                rng: dict[str, Any], entry: dict[str, Any], healthy: bool) -> None:
        """Write (or wait for) this rank's part, agree on success, and commit on rank 0."""
        error: str | None = None
        try:
            write()
            body = json.dumps(rng).encode()
            atomic_write(target / f"rng-rank{self.rank}.json", lambda f: f.write(body))
            if self.rank == 0:
                job_body = json.dumps(job).encode()
                atomic_write(target / JOB_FILE, lambda f: f.write(job_body))
        except (Exception, CheckpointException) as exc:  # reported below; stays uncommitted
            error = _describe(exc)
        try:
            flags = torch.tensor([0 if error else 1, 1 if healthy else 0], dtype=torch.int32)
            if self._multi:
                dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=self._group)
            ok, all_healthy = bool(flags[0]), bool(flags[1])
            if ok and self.rank == 0:
                self._commit(target, {**entry, "healthy": all_healthy, "time": time.time()})
        except Exception as exc:
            ok, error = False, error or f"{type(exc).__name__}: {exc}"[:500]
        if not ok:
            self.counters.checkpoint_failures += 1
            self.last_failure = error or "another rank failed to write its part"
            log.error("checkpoint %s failed and is not eligible for rollback: %s",
                      target.name, self.last_failure)

    def _commit(self, target: Path, entry: dict[str, Any]) -> None:
        atomic_write(target / COMMITTED, lambda f: f.write(b"ok\n"))
        with self._lock:
            entries = [e for e in self.manifest() if e["dir"] != entry["dir"]]
            entries.append(entry)
            entries.sort(key=lambda e: (e["step"], e.get("time", 0)))
            kept, dropped = self._retain(entries)
            self._write_manifest(kept)
        for old in dropped:  # only after the manifest stopped naming them
            if "/" not in old["dir"] and not old["dir"].startswith("."):
                shutil.rmtree(self.directory / old["dir"], ignore_errors=True)

    @blocking(SAVE, when=lambda self: self._staging is not None)  # goodput: a blocked wait
    def wait_staged(self) -> None:
        """Block until the save in flight has its copy of the state (the optimizer does this
        before every step; call it before changing weights any other way)."""
        staging, self._staging = self._staging, None
        if staging is not None:
            try:
                staging.result()
            except Exception:  # the upload fails too and reports it
                log.debug("checkpoint staging failed", exc_info=True)

    @blocking(SAVE)  # goodput: the training thread waits here
    def wait(self) -> None:
        """Block until the save in flight (if any) is committed or has failed."""
        self.wait_staged()
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            try:
                inflight.result()
            except Exception:  # _finish reports its own failures; this is a bug in it
                log.exception("checkpoint commit raised")

    def close(self) -> None:
        self.wait()
        self._committer.close()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self._writer is not None:
            self._writer.release(id(self))

    # --- restore ----------------------------------------------------------------------------
    def _read(self, entry: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any],
                                                   dict[str, Any] | None]:
        """(scratch state dict, job document, my RNG or None) of a checkpoint; no side effects."""
        name = str(entry["dir"])
        if "/" in name or name.startswith(".") or not name.startswith("step-"):
            raise ValueError(f"manifest names an unsafe directory {name!r}")
        path = self.directory / name
        if not (path / COMMITTED).exists():
            raise FileNotFoundError(f"{path} is not committed (or not readable here)")
        scratch = _clone(self._state_dict())
        dcp.load(scratch, checkpoint_id=str(path), process_group=self._group)
        job = json.loads((path / JOB_FILE).read_text())
        rng_file = path / f"rng-rank{self.rank}.json"
        saved_world = int(entry.get("world_size", self.world_size))
        rng = None
        if self.rank < saved_world:  # a rank the saving job did not have keeps its own RNG
            rng = json.loads(rng_file.read_text())
        return scratch, job, rng

    def _apply(self, scratch: dict[str, Any], job: dict[str, Any],
               rng: dict[str, Any] | None) -> ts.TrainState:
        if self.optimizer is not None:
            set_state_dict(self.model, self.optimizer, model_state_dict=scratch["model"],
                           optim_state_dict=scratch["optim"])
        else:
            set_state_dict(self.model, [], model_state_dict=scratch["model"],
                           optim_state_dict={})
        if self.scheduler is not None and job.get("scheduler") is not None:
            self.scheduler.load_state_dict(job["scheduler"])
        if self.scaler is not None and job.get("scaler") is not None:
            self.scaler.load_state_dict(job["scaler"])
        if rng is not None:
            _set_rng_state(rng)
        saved = ts.TrainState.from_json(job.get("train_state") or {})
        if self.data is not None and saved.loader is not None:
            self.data.load_state_dict(saved.loader)
        return saved

    @blocking(RESTORE)
    def rollback(self, before_step: int | None = None) -> Restored:
        """Restore the newest healthy checkpoint on every rank, or on none. Collective.

        Rank 0 chooses; all ranks read it into scratch memory; only if every rank succeeded
        does any rank apply it. Command effects (LR multiplier, skip list, applied command
        ids) recorded since the checkpoint are kept and re-applied, never undone. Raises
        NoHealthyCheckpoint or RollbackFailed identically on every rank.
        """
        self.wait()
        refused: list[str] = []
        while True:
            entry = self._from_rank0(self._newest_healthy_except(before_step, refused)
                                     if self.rank == 0 else None)
            if entry is None:
                raise NoHealthyCheckpoint(
                    f"no healthy checkpoint in {self.directory}"
                    + (f" (refused, non-finite weights: {', '.join(refused)})" if refused
                       else ""))
            error: str | None = None
            loaded = None
            finite = True
            try:
                loaded = self._read(entry)
                nonfinite = _nonfinite_weights(loaded[0]["model"])
                if nonfinite:
                    finite = False
                    log.error("checkpoint %s holds non-finite weights on rank %d (%s): not a "
                              "rollback target", entry["dir"], self.rank,
                              ", ".join(nonfinite[:5]))
            except (Exception, CheckpointException) as exc:  # the latter is a BaseException
                error = f"{type(exc).__name__}: {exc}"[:300]
                log.error("rank %d cannot read checkpoint %s: %s", self.rank, entry["dir"],
                          error)
            ok, all_finite = self._all_ok_pair(error is None, finite)
            if not ok or loaded is None:
                raise RollbackFailed(
                    f"checkpoint {entry['dir']} could not be read by every rank "
                    f"({'this rank: ' + error if error else 'another rank failed'}); "
                    "no rank changed its state")
            if all_finite:
                break
            # Labelled healthy by its losses, yet its weights are NaN or Inf on some rank:
            # restoring it would leave the job poisoned. Marked unhealthy; the next older one.
            refused.append(str(entry["dir"]))
            if self.rank == 0:
                self._mark_unhealthy(str(entry["dir"]))
        effects = self.state.effects()
        saved_multiplier = float((loaded[1].get("train_state") or {}).get("lr_multiplier", 1.0))
        restored = self._apply(*loaded)
        restored.merge_effects(effects)  # what remediation did since then stays in force
        self.state = restored
        self._reapply_lr(saved_multiplier)
        return Restored(step=int(loaded[1]["step"]), directory=str(entry["dir"]),
                        train_state=restored)

    @blocking(RESTORE)
    def resume(self) -> Restored | None:
        """At start: restore the newest healthy checkpoint if there is one (collective)."""
        has_one = self._from_rank0(self.newest_healthy() is not None if self.rank == 0
                                   else None)
        self.state.merge_effects(ts.read_effects(self.directory))
        if not has_one:
            self._reapply_lr(1.0)  # journalled effects with no checkpoint yet
            return None
        self.state.merge_effects(ts.read_effects(self.directory))
        return self.rollback()

    def _reapply_lr(self, saved_multiplier: float) -> None:
        """The optimizer and scheduler came back with the LR of the checkpoint; scale them to
        the multiplier in force now (LR cuts applied after that checkpoint stay)."""
        if self.optimizer is None or saved_multiplier <= 0:
            return
        ratio = self.state.lr_multiplier / saved_multiplier
        if ratio == 1.0:
            return
        floor = self.state.lr_floor
        for group in self.optimizer.param_groups:
            group["lr"] = max(group["lr"] * ratio, floor)
        if self.scheduler is not None and hasattr(self.scheduler, "base_lrs"):
            self.scheduler.base_lrs = [max(lr * ratio, floor) for lr in self.scheduler.base_lrs]

    def journal_effects(self) -> None:
        """Persist the command effects now (rank 0; every rank holds the same state)."""
        if self.rank == 0:
            ts.write_effects(self.directory, self.state)
