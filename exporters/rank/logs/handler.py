"""`AsyncEcsHandler`: a logging.Handler whose caller appends the record to a queue.

Why not the stdlib: `QueueListener` drops what is still queued at exit, and a handler that
formats or writes on the caller's thread costs the training loop microseconds per call. Here
the caller pays for a filter check, a type check of the message args and a deque append;
once per `batch_size` records the caller that fills the batch renders and JSON-encodes it in
one go (the records are still in its CPU cache, and with the GIL the writer thread's work is
not free for the caller anyway), and the background thread only writes. A stalled disk never
stalls the caller: batches beyond `capacity` are dropped and counted instead of encoded.
`encode_on_caller=False` leaves the encoding to the background thread too.

Choices a user should know about (see docs/logging.md):

* Message args are rendered later than the call (with their batch). If an arg is not an
  immutable scalar (int, float, str, bytes, bool, None) the caller renders the message at
  once, so a list or tensor mutated after the call cannot change what is logged. A
  non-string `msg` object is rendered late; log `str(obj)` when it may change.
* `exc_info` is turned into text on the caller (rare, and its traceback may change later).
* Overflow: the queue holds `capacity` records. With `overflow="drop"` (default) a full queue
  never blocks the caller: the record is dropped and counted, and the writer logs one
  WARNING summary record with the number dropped. `overflow="block"` makes the caller wait
  for room instead (for logs that must not be lost, at the price of stalling the loop).
* Layout: `layout="ecs"` (default) follows Elastic's ECS logging spec; `layout="ecs-logging"`
  writes exactly what Elastic's `ecs-logging` package writes (slower; see ecs_compat.py).
* Wake-ups: the writer wakes on its timer (`flush_interval`) and when half the capacity
  waits (`wake_batches`), never per so many records: each wake-up costs the training loop
  forced GIL hand-offs whose price depends on the CPU and the kernel (docs/performance.md).
* Records are flushed by `flush()`, `close()` (idempotent), at interpreter exit and on
  SIGTERM (chained to the previous SIGTERM handler). A stalled disk cannot hang exit: close
  waits at most `close_timeout` seconds and reports what it had to abandon.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from functools import partial
from operator import call
from pathlib import Path
from typing import Any, Protocol

from trainwatch.exporters.contract.identity import (
    detect_job,
    detect_rank,
    validate_job,
    validate_rank,
)
from trainwatch.exporters.rank.logs import shutdown_hooks
from trainwatch.exporters.rank.logs.config import HandlerConfig
from trainwatch.exporters.rank.logs.ecs import EcsFormatter, capture_error
from trainwatch.exporters.rank.logs.ecs_compat import (
    EcsLoggingCompatFormatter,
    capture_error_compat,
)
from trainwatch.exporters.rank.logs.rotating_writer import RotatingJsonlWriter

_IMMUTABLE_ARG_TYPES = frozenset({int, float, str, bytes, bool, type(None)})


class LineWriter(Protocol):
    """Where encoded lines go; RotatingJsonlWriter in production, injectable for tests."""

    def write_lines(self, lines: list[bytes]) -> None: ...
    # Optional: `write_block(data)`, newline-terminated lines in one buffer (saves a copy), and
    # `write_blocks(blocks)`, several such buffers at once (writev: saves joining them).
    def flush(self) -> None: ...
    def close(self) -> None: ...


class AsyncEcsHandler(logging.Handler):
    """ECS JSON lines for one training rank, written by a background thread.

    Give `directory` (the file is `<directory>/<job>/rank-<rank>.jsonl`) or an explicit
    `path`. `job` and `rank` default to the launcher environment
    (trainwatch.exporters.contract.identity:
    detect_job and detect_rank; docs/logging.md lists the variables).
    """

    def __init__(self, directory: str | Path | None = None, *,
                 config: HandlerConfig | None = None, writer: LineWriter | None = None,
                 **options: Any) -> None:
        """`options` are HandlerConfig's fields (`job=`, `capacity=`, ...), or give `config`;
        `writer` replaces the rotating file (tests, other sinks)."""
        if config is None:
            config = HandlerConfig(directory=directory, **options)
        elif directory is not None or options:
            raise TypeError("give either config= or the settings as keyword arguments")
        super().__init__(config.level)
        self.config = config
        self.job = config.job if config.job is not None else validate_job(detect_job())
        self.rank = config.rank if config.rank is not None else validate_rank(detect_rank())
        if writer is None:
            target = config.target(self.job, self.rank)
            writer = RotatingJsonlWriter(target, max_bytes=config.max_bytes,
                                         backup_count=config.backup_count)
            self.path: Path | None = target
        else:
            self.path = Path(config.path) if config.path is not None else None
        capacity, batch_size = config.capacity, config.batch_size
        self._writer = writer
        self._write_block: Callable[[bytes], None] | None = getattr(writer, "write_block", None)
        self._write_blocks: Callable[[list[bytes]], None] | None = getattr(
            writer, "write_blocks", None)
        self._capacity = capacity
        self._block = config.overflow == "block"
        self._batch_size = batch_size
        self._wake_at = min(batch_size, capacity) - 1
        # Encoded batches that may wait for the writer: with the batch being filled, at most
        # `capacity` records are held (see _encode_on_caller_batch).
        self._room = max(1, capacity // batch_size - 1)
        # The writer wakes on its timer (`flush_interval`), and a caller wakes it early only
        # when half the room is taken: the number of wake-ups, and so of GIL hand-offs
        # between the writer and the training loop, is set by the clock, not by how much
        # is logged: what a hand-off costs depends on the CPU and the kernel (a writer woken
        # per 16 batches ran at 0.77 of NullHandler's rate on an AMD EPYC VM and at 0.35 on
        # an Intel Xeon one, docs/performance.md).
        self._wake_batches = config.wake_batches or max(1, self._room // 2)
        self._flush_interval = config.flush_interval
        self._close_timeout = config.close_timeout
        self._queue: deque[logging.LogRecord] = deque()
        # Batches taken off `_queue`, in order: a list of records, or [count, bytes] once the
        # caller that took it has encoded it (see _take and _encode_on_caller_batch).
        self._taken: deque[list] = deque()
        # Blocks the writer has written, kept until a caller encodes its next batch: that
        # caller drops one just before it allocates the next block, so the allocator hands
        # the same memory back (see _encode_on_caller_batch). Bounded by the room (the
        # writer keeps `_spent` and `_taken` together within it: `capacity` records' worth
        # at most, on top of those waiting); cleared when idle.
        self._spent: deque[bytes] = deque(maxlen=self._room)
        self._encode_on_caller = config.encode_on_caller
        self._wake = threading.Event()
        self._cond = threading.Condition()
        self._drop_lock = threading.Lock()
        self._busy = False
        self._flush_wanted = False
        self._stopping = False
        self._closed = False
        self._close_lock = threading.Lock()
        self._exception_formatter = logging.Formatter()
        self._ecs: EcsFormatter | EcsLoggingCompatFormatter
        service, dataset = config.service, config.dataset
        if config.layout == "ecs":
            self._ecs = EcsFormatter(service=service, job=self.job, rank=self.rank,
                                     dataset=dataset, prefer_orjson=config.use_orjson)
        else:
            self._ecs = EcsLoggingCompatFormatter(extra={
                "service.name": service, "event.dataset": dataset or service,
                "host.name": socket.gethostname(),
                "labels.training_job": self.job, "labels.rank": str(self.rank)})
        self._layout = config.layout
        # Counters: callers only increment `_dropped` (under a lock, on the rare overflow path);
        # the writer thread alone updates the others.
        self._dropped = 0
        self._dropped_reported = 0
        self.written = 0
        self.lost = 0
        self.format_errors = 0
        self._thread = threading.Thread(target=self._run, name=f"trainwatch-log-writer-{id(self)}",
                                         daemon=True)
        self.handle = self._make_caller_path()  # type: ignore[method-assign]
        self._thread.start()
        shutdown_hooks.register(self, sigterm=config.install_signal_handler)

    # --- caller side: keep this short ---------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Records refused because the queue was full (or the handler already closed)."""
        return self._dropped

    def _make_caller_path(self) -> Callable[[logging.LogRecord], logging.LogRecord | bool]:
        """The whole caller-side path as one closure, installed as this instance's `handle`.

        Why a closure: every call costs the training loop, and free variables are read faster
        than attributes. No handler lock: the deque is thread-safe. close() swaps in
        `_handle_closed`, so the open path needs no closed check. Once per `batch_size`
        records the caller encodes the batch itself (`_encode_on_caller_batch`), see there.
        """
        filters = self.filters  # addFilter/removeFilter change this same list
        queue = self._queue
        append = queue.append
        wake_at = self._wake_at
        immutable_types = _IMMUTABLE_ARG_TYPES
        immutable = immutable_types.issuperset
        prepare = self._prepare
        batch_full = (self._encode_on_caller_batch if self._encode_on_caller
                      else self._writer_batch_full)

        def handle(record: logging.LogRecord) -> logging.LogRecord | bool:
            if filters:
                rv = self.filter(record)
                if not rv:
                    return rv
                if isinstance(rv, logging.LogRecord):
                    record = rv
            args = record.args
            if args:
                # Spelled out for one and two args (most calls): ~60 ns less than the C
                # superset check, whose map() and iterator setup dominate at these sizes.
                if type(args) is tuple and len(args) == 2:
                    frozen = type(args[0]) in immutable_types and type(args[1]) in immutable_types
                elif type(args) is tuple and len(args) == 1:
                    frozen = type(args[0]) in immutable_types
                else:
                    frozen = type(args) is tuple and immutable(map(type, args))
                if not frozen and not prepare(record):
                    return record
            if record.exc_info and not prepare(record):
                return record
            append(record)
            # No capacity check here: the call that fills a batch takes the queue (or, with
            # encode_on_caller=False, enforces the capacity in _writer_batch_full).
            if len(queue) > wake_at:
                batch_full()
            return record

        return handle

    def _take(self) -> list:
        """Move every queued record, in order, into a new batch at the end of `_taken`.

        The three steps run inside one C call (no bytecode between them), so no other thread
        and no signal handler can run in between: a record is always either in `_queue` or in
        a batch the writer will see, never only in some caller's local variable. That is what
        keeps SIGTERM lossless when it interrupts a caller that is encoding.
        """
        batch: list = []
        queue = self._queue
        deque(map(call, (partial(batch.extend, queue), queue.clear,
                         partial(self._taken.append, batch))), maxlen=0)
        return batch

    def _encode_on_caller_batch(self) -> None:
        """Called by the caller once a batch is full: take it and encode it right here.

        Why on the caller: with the GIL, work on the writer thread is not free for the
        training loop either (it takes the GIL from it), and the records are still in the
        CPU's cache here: the handler's own cost fell from ~2.4 to ~1.85 us per record
        (measured, docs/performance.md). The writer only writes. If the writer is behind by
        `capacity` records (a stalled disk), the batch is dropped and counted instead of
        encoded, so the caller's cost stays flat; with overflow="block" the caller waits.
        """
        try:
            taken = self._taken
            # Batches waiting for the writer, counted as full ones, leave room for the batch
            # being filled, so at most `capacity` records are held.
            room = self._room
            if len(taken) >= room:
                if self._block:
                    with self._cond:
                        while len(taken) >= room and not self._closed:
                            self._wake.set()
                            self._cond.wait(0.1)
                else:
                    dropped: list = []
                    queue = self._queue
                    deque(map(call, (partial(dropped.extend, queue), queue.clear)), maxlen=0)
                    with self._drop_lock:
                        self._dropped += len(dropped)
                    self._wake.set()  # the writer must be on its way (it reports the drops)
                    return
            spent = self._spent
            if spent:
                # Free one block the writer is done with right before the next block is
                # allocated: the allocator reuses that memory. Freed all at once by the writer,
                # a few hundred KB would reach the top of the heap, which glibc gives back
                # to the OS (past its 128 KB trim threshold) and the next blocks then fault
                # in fresh pages: ~80 page faults per 1,000 records in a fresh process, ~0.3 us
                # per record here (docs/performance.md, the page-fault table of the
                # AsyncEcsHandler section).
                with suppress(IndexError):  # the writer may have cleared it in between
                    spent.pop()  # the newest: the likeliest to be in cache
            batch = self._take()
            if batch:
                # One C call swaps the records for [count, bytes]: the records are freed here,
                # while still in this CPU's cache, instead of later on the writer thread.
                batch[:] = (len(batch), self._encode_block(batch))
            if len(taken) >= self._wake_batches and not self._wake.is_set():
                self._wake.set()
        except Exception:  # logging must never raise into the training loop: the writer
            self._wake.set()  # encodes a batch that has no bytes appended

    def _handle_closed(self, record: logging.LogRecord) -> logging.LogRecord | bool:
        with self._drop_lock:
            self._dropped += 1
        return record

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)

    def _prepare(self, record: logging.LogRecord) -> bool:
        """Freeze what may change after the call: the exception text and mutable args."""
        try:
            if record.exc_info:
                if self._layout == "ecs":
                    capture_error(record, self._exception_formatter)
                else:
                    capture_error_compat(record)
            if record.args and (type(record.args) is not tuple or not
                                _IMMUTABLE_ARG_TYPES.issuperset(map(type, record.args))):
                record.msg = record.getMessage()
                record.args = None
        except Exception:  # logging must never raise into the training loop
            self.handleError(record)
            return False
        return True

    def _writer_batch_full(self) -> None:
        """encode_on_caller=False: a batch waits for the writer. Called by every record beyond
        it until the writer takes the queue; enforces `capacity` on the record just queued."""
        queue = self._queue
        if len(queue) > self._capacity:
            if self._block and not self._closed:
                with self._cond:
                    while len(queue) > self._capacity and not self._closed:
                        self._wake.set()
                        self._cond.wait(0.1)
            else:
                try:  # the newest record (another caller's, if it came in between: same count)
                    queue.pop()
                except IndexError:  # the writer took the queue in between: nothing to drop
                    pass
                else:
                    with self._drop_lock:
                        self._dropped += 1
        if not self._wake.is_set():
            self._wake.set()

    # --- writer thread --------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            woken = self._wake.wait(self._flush_interval)
            self._wake.clear()
            flush_wanted, self._flush_wanted = self._flush_wanted, False
            if flush_wanted or self._stopping or not self._encode_on_caller:
                # flush()/close()/SIGTERM, or the writer encodes: everything, until empty.
                wrote = self._drain(take_queue=True)
            else:
                # Woken by a caller (half the room is taken) or by the timer: one write of
                # what waits, then wait again. Every return from a blocking call needs the GIL
                # back, which the training loop only gives up when forced (after
                # sys.getswitchinterval()), so each round costs the loop a forced thread
                # switch: the writer never loops after callers that keep logging. On the
                # timer it also takes the partly filled queue (records are written within
                # `flush_interval`); callers encode it otherwise.
                wrote = self._drain(take_queue=not woken, once=True)
            if not woken and not wrote:  # idle for a whole interval: give the memory back
                self._spent.clear()
            if self._stopping:
                self._drain(take_queue=True)
                self._spent.clear()
                return

    def _drain(self, take_queue: bool, once: bool = False) -> bool:
        """Write the waiting batches (and the queue, if `take_queue`): until none wait, or
        `once`: what waits now, in one write. True if it wrote any."""
        taken = self._taken
        wrote = False
        while True:
            with self._cond:
                if (wrote and once) or (not taken and not (take_queue and self._queue)
                                        and self._dropped == self._dropped_reported):
                    self._cond.notify_all()
                    return wrote
                wrote = True
                self._busy = True
            if take_queue and self._queue:
                self._take()
            parts: list[bytes] = []
            count = 0
            while taken and count < self._batch_size * self._room:
                batch = taken.popleft()[:]  # a copy: its caller may still be encoding it
                if len(batch) == 2 and type(batch[1]) is bytes:  # encoded: [count, bytes]
                    count += batch[0]
                    parts.append(batch[1])
                elif batch:  # records whose caller did not finish (or the writer took them)
                    count += len(batch)
                    parts.append(self._encode_block(batch))
            summary = self._drop_summary()
            if summary is not None:
                parts.append(summary + b"\n")
            try:
                if self._write_blocks is not None:
                    self._write_blocks(parts)
                elif self._write_block is not None:
                    self._write_block(b"".join(parts))
                elif block := b"".join(parts):
                    self._writer.write_lines(block[:-1].split(b"\n"))
                if not taken and not self._queue:
                    self._writer.flush()
                self.written += count
                if self._encode_on_caller:
                    spent = self._spent  # callers free them (_encode_on_caller_batch)
                    spent.extend(parts)
                    with suppress(IndexError):  # waiting and kept blocks: within the room
                        while len(spent) + len(taken) > self._room:
                            spent.popleft()
            except Exception as exc:  # a full disk must not kill the writer
                self.lost += count
                print(f"trainwatch AsyncEcsHandler: lost {count} records: {exc!r}",
                      file=sys.stderr)
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _encode_block(self, batch: list[logging.LogRecord]) -> bytes:
        """The batch as newline-terminated lines in one buffer (JSON never holds a raw newline)."""
        try:
            return self._ecs.block(batch)
        except Exception:  # one odd record must not cost the batch: go one by one
            line = self._ecs.line
        lines = []
        for record in batch:
            try:
                lines.append(line(record))
            except Exception:  # one odd record must not cost the batch
                self.format_errors += 1
        return b"".join(item + b"\n" for item in lines)

    def _drop_summary(self) -> bytes | None:
        dropped = self._dropped
        newly = dropped - self._dropped_reported
        if newly <= 0:
            return None
        self._dropped_reported = dropped
        record = logging.LogRecord(
            "trainwatch.logs", logging.WARNING, __file__, 0,
            "dropped %d log records: queue full (capacity %d); %d dropped since start",
            (newly, self._capacity, dropped), None)
        record.trainwatch = {"dropped_records": newly, "dropped_total": dropped}  # type: ignore[attr-defined]
        return self._ecs.line(record)

    # --- lifecycle --------------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far is written; False if `timeout` passed first."""
        if not self._thread.is_alive():
            return not self._queue and not self._taken
        self._flush_wanted = True
        self._wake.set()
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._queue and not self._taken and not self._busy
                and self._dropped == self._dropped_reported,
                self._close_timeout if timeout is None else timeout)

    def disable_after_fork(self) -> None:
        """Called in a forked child: this copy has no writer thread and a copy of the parent's
        file buffer, so it must never write. Later records are dropped and counted."""
        self._closed = True
        self.handle = self._handle_closed  # type: ignore[method-assign]
        self._stopping = True
        self._queue.clear()
        self._taken.clear()
        self._spent.clear()

    def close(self) -> None:
        """Write what is queued and stop the writer; safe to call any number of times."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self.handle = self._handle_closed  # type: ignore[method-assign]
        self._stopping = True
        self._wake.set()
        if self._thread.ident is not None and self._thread.is_alive():
            self._thread.join(self._close_timeout)
        if self._thread.is_alive():
            left = len(self._queue) + len(self._taken) * self._batch_size
            print(f"trainwatch AsyncEcsHandler: writer stalled; abandoning {left} "
                  f"queued records after {self._close_timeout}s", file=sys.stderr)
        else:
            self._writer.close()
        shutdown_hooks.unregister(self)
        super().close()
