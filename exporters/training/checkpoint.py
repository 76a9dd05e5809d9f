"""Checkpoint manager: atomic saves, a manifest with a healthy flag, retention, rollback.

Layout of a checkpoint directory:

    manifest.json              {"version": 1, "checkpoints": [{"step", "loss", "healthy",
                                "file", "time"}, ...]}   (oldest first)
    step-0000000120.pt         model, optimizer, scheduler, step, every rank's RNG state

Data-parallel replicas hold identical weights, so rank 0 writes one file for the job (with
every rank's RNG state gathered into it) while the other ranks wait at a barrier; every rank
reads the same file on rollback. (Sharded models would write one file per rank; that is a
different manager.) A save is atomic: write a temp file in the same directory, fsync it,
rename it over the final name, fsync the directory; the manifest is replaced the same way
afterwards, so a crash at any moment leaves the previous manifest pointing at complete files.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from exporters.atomic_file import atomic_write

MANIFEST = "manifest.json"


def weights_digest(model: torch.nn.Module | dict[str, Any]) -> str:
    """SHA-256 over a model's (or state dict's) tensors in key order: equal iff bit-identical."""
    state = model if isinstance(model, dict) else _unwrap(model).state_dict()
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        digest.update(key.encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """DistributedDataParallel and similar wrappers keep the real model in `.module`."""
    return getattr(model, "module", model)


def _bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def _tensor(raw: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def _rng_state() -> dict[str, Any]:
    """This rank's RNG states as plain Python values (bytes, tuples).

    Plain values because all_gather_object of objects holding tensors is fragile across torch
    versions, and because the checkpoint is then loadable with torch.load(weights_only=True).
    """
    state: dict[str, Any] = {"torch": _bytes(torch.get_rng_state()),
                             "python": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, pos, has_gauss, gauss = numpy.random.get_state()
        state["numpy"] = (kind, keys.tolist(), int(pos), int(has_gauss), float(gauss))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_bytes(t) for t in torch.cuda.get_rng_state_all()]
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(_tensor(state["torch"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        kind, keys, pos, has_gauss, gauss_np = state["numpy"]
        numpy.random.set_state((kind, numpy.array(keys, dtype=numpy.uint32), pos, has_gauss,
                                gauss_np))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_tensor(b) for b in state["cuda"]])


class NoHealthyCheckpoint(RuntimeError):
    """Rollback was asked for but the manifest has no healthy checkpoint."""


class CheckpointManager:
    """Saves and restores the training state of every rank of a data-parallel job."""

    def __init__(self, directory: str | Path, model: torch.nn.Module, optimizer: Any = None,
                 scheduler: Any = None, keep: int = 3, process_group: Any = None) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.directory = Path(directory)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.keep = keep
        self._group = process_group
        self._distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(process_group) if self._distributed else 0
        self.world_size = dist.get_world_size(process_group) if self._distributed else 1
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            for leftover in self.directory.glob(".*.tmp"):  # a save killed half-way
                leftover.unlink(missing_ok=True)
        self._barrier()

    def _barrier(self) -> None:
        if self._distributed and self.world_size > 1:
            dist.barrier(group=self._group)

    def _agree(self, rank0_error: str | None) -> str | None:
        """Rank 0's error (or None) on every rank; doubles as the barrier after a save."""
        if not (self._distributed and self.world_size > 1):
            return rank0_error
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, rank0_error, group=self._group)
        return gathered[0]

    # --- manifest ---------------------------------------------------------------------------
    def manifest(self) -> list[dict[str, Any]]:
        """Entries oldest first; an absent manifest is an empty list."""
        try:
            data = json.loads((self.directory / MANIFEST).read_text())
        except FileNotFoundError:
            return []
        entries = data.get("checkpoints", []) if isinstance(data, dict) else []
        return [e for e in entries if isinstance(e, dict) and isinstance(e.get("step"), int)]

    def _write_manifest(self, entries: list[dict[str, Any]]) -> None:
        body = json.dumps({"version": 1, "checkpoints": entries}, indent=1).encode()
        atomic_write(self.directory / MANIFEST, lambda f: f.write(body))

    def newest_healthy(self) -> dict[str, Any] | None:
        healthy = [e for e in self.manifest() if e.get("healthy")]
        return max(healthy, key=lambda e: e["step"]) if healthy else None

    # --- save -------------------------------------------------------------------------------
    def save(self, step: int, loss: float | None = None, healthy: bool | None = None) -> Path:
        """Checkpoint the state after `step` completed. Collective: call on every rank.

        Healthy (a rollback target) unless told otherwise or any rank's loss is non-finite.
        """
        mine = {"rng": _rng_state(),
                "finite": loss is None or math.isfinite(float(loss))}
        if self._distributed and self.world_size > 1:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, mine, group=self._group)
        else:
            gathered = [mine]
        path = self.directory / f"step-{step:010d}.pt"
        error: str | None = None
        failure: Exception | None = None
        if self.rank == 0:
            try:
                is_healthy = all(g["finite"] for g in gathered) if healthy is None else healthy
                state = {
                    "step": step,
                    "model": _unwrap(self.model).state_dict(),
                    "optimizer": self.optimizer.state_dict() if self.optimizer else None,
                    "scheduler": self.scheduler.state_dict() if self.scheduler else None,
                    "rng": [g["rng"] for g in gathered],
                }
                atomic_write(path, lambda f: torch.save(state, f))
                loss_value = float(loss) if loss is not None else None
                if loss_value is not None and not math.isfinite(loss_value):
                    loss_value = None
                entries = [e for e in self.manifest() if e["step"] != step]
                entries.append({"step": step, "file": path.name, "time": time.time(),
                                "loss": loss_value, "healthy": bool(is_healthy)})
                entries.sort(key=lambda e: e["step"])
                kept, dropped = self._retain(entries)
                self._write_manifest(kept)
                for entry in dropped:  # only after the manifest stopped naming them
                    (self.directory / Path(entry["file"]).name).unlink(missing_ok=True)
            except Exception as exc:  # re-raised below, after telling the peers
                failure, error = exc, f"{type(exc).__name__}: {exc}"
        # Every rank learns rank 0's outcome, so a failed save fails on all ranks together
        # instead of leaving the others in a barrier while rank 0 trains on.
        error = self._agree(error)
        if failure is not None:
            raise failure
        if error is not None:
            raise OSError(f"checkpoint save at step {step} failed on rank 0: {error}")
        return path

    def _retain(self, entries: list[dict[str, Any]]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(kept, dropped): the newest `keep` plus the newest healthy one are kept, so a run
        of unhealthy saves after a NaN can never push the last good state out."""
        kept = entries[-self.keep:]
        healthy = [e for e in entries if e.get("healthy")]
        if healthy and healthy[-1] not in kept:
            kept = [healthy[-1], *kept]
        return kept, [e for e in entries if e not in kept]

    # --- restore ----------------------------------------------------------------------------
    def load(self, entry: dict[str, Any]) -> dict[str, Any]:
        name = str(entry["file"])
        if "/" in name or name.startswith("."):
            raise ValueError(f"manifest names an unsafe file {name!r}")
        return torch.load(self.directory / name, map_location="cpu", weights_only=True)

    def rollback(self) -> int:
        """Restore the newest healthy checkpoint on this rank; return its step."""
        entry = self.newest_healthy()
        if entry is None:
            raise NoHealthyCheckpoint(f"no healthy checkpoint in {self.directory}")
        state = self.load(entry)
        _unwrap(self.model).load_state_dict(state["model"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        rng = state.get("rng") or []
        if rng:
            _set_rng_state(rng[self.rank] if self.rank < len(rng) else rng[0])
        return int(state["step"])
