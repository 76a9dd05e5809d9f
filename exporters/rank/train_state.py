"""What a job's training state holds besides tensors: data position, skip list, command effects.

Remediation changes a run (an LR cut, batches to skip); those changes must outlive a rollback
and a restart, or a rollback silently undoes the fix and a restarted job re-reads the poison.
So they are part of the training state: saved in every checkpoint, and also journalled on
their own (`effects.json` beside the checkpoints) the moment they are agreed, so a restart
before the next checkpoint keeps them too. Every rank holds the same TrainState (it only
changes at agreed step boundaries), so rank 0 alone writes it.

Plain JSON values only: the state is small, human-readable, and loading it never unpickles.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainwatch.exporters.contract.atomic_file import atomic_write

MAX_APPLIED = 1000  # command outcomes remembered for exactly-once (oldest forgotten first)
EFFECTS = "effects.json"


@dataclass
class TrainState:
    """Job-wide state that rides in every checkpoint.

    `next_batch` is the data position: the index of the batch the loop reads next (a global
    index, the same on every rank; each rank maps it to its own shard). `skip` holds half-open
    [start, end) batch ranges that `take_batch` never returns. `lr_multiplier` is the product
    of every applied LR cut, `lr_floor` the highest floor asked for. `applied` maps command id
    to its outcome, newest last. `loader` is a data loader's own state dict, when it has one.
    `bad_batch` is the first batch of the earliest step whose loss was non-finite on any rank
    since the last rollback (agreed at sync steps, so the same on every rank): a rollback
    skips from it even after a restart, when the losses that showed it are gone with the
    process. It is an effect (kept across a rollback's restore) until a rollback uses it.
    """

    next_batch: int = 0
    epoch: int = 0
    skip: list[list[int]] = field(default_factory=list)
    lr_multiplier: float = 1.0
    lr_floor: float = 0.0
    applied: dict[str, dict[str, Any]] = field(default_factory=dict)
    loader: dict[str, Any] | None = None
    bad_batch: int | None = None

    # --- data position ------------------------------------------------------------------
    def take_batch(self) -> int:
        """The next batch index not in the skip list; advances the position past it."""
        index = self.next_batch
        moved = True
        while moved:
            moved = False
            for start, end in self.skip:
                if start <= index < end:
                    index, moved = end, True
        self.next_batch = index + 1
        return index

    def add_skip(self, start: int, count: int) -> list[int] | None:
        """Never read batches [start, start + count) again; returns the range added."""
        if count <= 0:
            return None
        window = [int(start), int(start) + int(count)]
        if window not in self.skip:
            self.skip.append(window)
            self.skip.sort()
        return window

    # --- command effects ----------------------------------------------------------------
    def record_applied(self, command_id: str, outcome: dict[str, Any]) -> None:
        self.applied.pop(command_id, None)
        self.applied[command_id] = outcome
        while len(self.applied) > MAX_APPLIED:
            self.applied.pop(next(iter(self.applied)))

    def effects(self) -> dict[str, Any]:
        """The part a rollback must keep: what remediation did, not where training was."""
        return {"skip": [list(w) for w in self.skip], "lr_multiplier": self.lr_multiplier,
                "lr_floor": self.lr_floor, "applied": dict(self.applied),
                "bad_batch": self.bad_batch}

    def merge_effects(self, effects: dict[str, Any]) -> None:
        """Adopt effects recorded later than this state (the in-memory or journalled ones)."""
        for window in effects.get("skip", []):
            if isinstance(window, list) and len(window) == 2 and window not in self.skip:
                self.skip.append([int(window[0]), int(window[1])])
        self.skip.sort()
        self.lr_multiplier = float(effects.get("lr_multiplier", self.lr_multiplier))
        self.lr_floor = float(effects.get("lr_floor", self.lr_floor))
        if "bad_batch" in effects:  # the newer record wins, a cleared one (None) included
            bad = effects["bad_batch"]
            self.bad_batch = bad if type(bad) is int and bad >= 0 else None
        for command_id, outcome in dict(effects.get("applied", {})).items():
            if command_id not in self.applied:
                self.record_applied(command_id, outcome)

    # --- (de)serialisation --------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainState:
        state = cls()
        state.next_batch = int(data.get("next_batch", 0))
        state.epoch = int(data.get("epoch", 0))
        state.loader = data.get("loader")
        state.merge_effects(data)
        return state


def write_effects(directory: Path, state: TrainState) -> None:
    """Journal the effects now (atomically), so a restart before the next checkpoint keeps them."""
    body = json.dumps({"version": 1, **state.effects()}, indent=1).encode()
    atomic_write(directory / EFFECTS, lambda f: f.write(body))


def read_effects(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / EFFECTS).read_text())
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}
