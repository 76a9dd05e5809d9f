"""Batches chosen by Trainwatch's data position, for loops a framework owns (HF, Lightning).

A framework's loop pulls batches from a DataLoader; `TrainwatchBatches` is the iterable
dataset behind it: every batch it produces is `TrainingMonitor.next_batch()` (so a rollback
rewinds the data position and skipped batches are never produced), and it remembers, in
order, which batch index it produced, because frameworks fetch one batch ahead (accelerate's
DataLoaderShard, Lightning's prefetching fetcher): the batch a step trains on is the oldest
one fetched and not yet consumed (`consumed()`), not the newest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import IterableDataset


class TrainwatchBatches(IterableDataset):
    """Yields the items of batch `next_batch()`, then of the next one, forever.

    `dataset[i]` for i in batch b's indices (b * batch_size ... wrapping around the dataset).
    Use with DataLoader(batch_size=batch_size) and a step limit (max_steps): there is no end
    of epoch, since the data position lives in the checkpointed TrainState.
    """

    def __init__(self, dataset: Sequence[Any], batch_size: int,
                 next_batch: Callable[[], int]) -> None:
        if batch_size < 1 or len(dataset) < 1:
            raise ValueError("batch_size and the dataset must be non-empty")
        self.dataset = dataset
        self.batch_size = batch_size
        self._next_batch = next_batch
        self._fetched: deque[int] = deque(maxlen=1024)
        self._generation = 0

    def __iter__(self) -> Iterator[Any]:
        size = len(self.dataset)
        generation = self._generation
        while True:
            if generation != self._generation:
                return  # discarded (see restart): a new iterator takes over the position
            index = self._next_batch()
            self._fetched.append(index)
            for i in range(self.batch_size):
                yield self.dataset[(index * self.batch_size + i) % size]

    def resume_position(self) -> int | None:
        """The data position to checkpoint: the oldest batch fetched but not yet trained on
        (None when nothing is fetched ahead)."""
        return self._fetched[0] if self._fetched else None

    def restart(self) -> list[int]:
        """After a rollback: the batches fetched ahead were chosen before it, so they must
        not be trained on. Forgets them (returned) and ends every iterator made so far at its
        next fetch, without consuming a data position; the framework must then be told to
        drop what it buffered and iterate afresh (the callbacks end the epoch; with this
        endless dataset the next epoch starts at the restored position)."""
        stale = list(self._fetched)
        self._fetched.clear()
        self._generation += 1
        return stale

    def consumed(self) -> int | None:
        """The batch index the framework is training on now (call once per micro-batch)."""
        return self._fetched.popleft() if self._fetched else None
