"""Training-side library: report each step cheaply, apply control commands consistently.

    tw = TrainingMonitor(job="llm-7b", optimizer=opt, scheduler=sched, checkpoints=ckpt)
    step = start
    while step < total:
        batch = data[tw.next_batch()]   # the data position, never a batch a rollback skipped
        ...forward, backward, optimizer.step()...
        tw.report(step, loss=loss_value, grad_norm=gn, samples=batch_size)
        control = tw.step_end(step)
        step = control.next_step        # step + 1, or the step after a restored checkpoint
    tw.close()

`report` runs on the training thread and only appends a tuple to a bounded deque (about a
microsecond); a background thread does everything else. `step_end` is where commands are
agreed and applied: every `sync_every` steps all ranks exchange the commands they know over
the job's process group and apply the union at that same step (see trainwatch.exporters.rank.sync).
Nothing here raises into the loop except a failing collective, which means the job itself is
broken (hiding it would leave ranks out of step).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainwatch.exporters.contract import catalog, identity
from trainwatch.exporters.contract import commands as cmd
from trainwatch.exporters.contract.launcher import RankInfo, detect
from trainwatch.exporters.rank import departure, goodput, sync
from trainwatch.exporters.rank import flops as flops_table
from trainwatch.exporters.rank.collectives import CollectiveWatch
from trainwatch.exporters.rank.config import MonitorConfig
from trainwatch.exporters.rank.counters import RankCounters, RankShared
from trainwatch.exporters.rank.flops import ModelFlops
from trainwatch.exporters.rank.forwarders import (
    Forwarder,
    ForwarderThread,
    MlflowForwarder,
    TensorBoardForwarder,
)
from trainwatch.exporters.rank.shipper import ControlPoller, Shipper
from trainwatch.exporters.rank.train_state import TrainState

log = logging.getLogger(__name__)
CommandHandler = Callable[[dict[str, Any], int], Any]


@dataclass
class Control:
    """What the loop must do after `step_end(step)`."""

    next_step: int
    skip_batches: int = 0
    rolled_back: bool = False
    applied: list[dict[str, Any]] = field(default_factory=list)


def _launch_incarnation(info: RankInfo, env: Mapping[str, str]) -> str:
    """The launch id when there is no process group to broadcast rank 0's (the monitor was
    made before init_process_group, or the ranks never form one): every rank of one launch on
    a node must derive the same id, or the exporter would take each rank for a new launch and
    drop the others. A lone process needs no agreement: a fresh id per launch."""
    if info.world_size <= 1:
        return uuid.uuid4().hex
    launch = "|".join((info.job, str(info.world_size), str(info.restarts),
                       identity.torchelastic_agent_dir(env),
                       env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", ""),
                       env.get("SLURM_JOB_ID", ""), env.get("SLURM_RESTART_COUNT", "")))
    return uuid.uuid5(uuid.NAMESPACE_OID, launch).hex


class TrainingMonitor:
    """Per-rank reporter and command applier. Create one per process, after init_process_group.

    Arguments not given come from the environment: job, rank, local rank, world size and
    restarts from the launcher (torchrun, Slurm, Open MPI); socket, exporter URL, token and
    sync period from TRAINWATCH_* variables (docs/contracts.md). `checkpoints` (a
    CheckpointManager) enables the rollback and checkpoint commands. The settings are
    MonitorConfig's fields, as keyword arguments (`sync_every=20`) or as `config=`.
    """

    def __init__(self, job: str | None = None, *, optimizer: Any = None, scheduler: Any = None,
                 checkpoints: Any = None, process_group: Any = None,
                 forwarders: list[Forwarder] | None = None, rank_info: RankInfo | None = None,
                 config: MonitorConfig | None = None, **options: Any) -> None:
        if config is None:
            config = MonitorConfig(**options)
        elif options:
            raise TypeError("give either config= or the settings as keyword arguments")
        env = os.environ
        # Checked before anything starts: a bad environment variable raises here.
        self.config = config = config.resolved(env)
        self.info = rank_info or detect(job=job)
        # Collective when distributed: every rank constructs the monitor at the same point.
        self._agreement = sync.Agreement(process_group)
        # One identity and one incarnation for the whole launch, both rank 0's: a job id
        # derived per node (trainwatch.exporters.contract.identity.job_from_env) becomes the job's,
        # and the
        # exporter tells this launch's ranks from a previous launch's (a restart, another
        # world size) by the incarnation.
        job_id, self.incarnation = self._agreement.broadcast(
            (self.info.job, uuid.uuid4().hex if self._agreement.world > 1
             else _launch_incarnation(self.info, env)))
        if job_id != self.info.job:
            self.info = dataclasses.replace(self.info, job=job_id)
        collectives = CollectiveWatch(self._agreement, self.info.job, self.info.rank,
                                      env.get(catalog.ENV_DIAGNOSTICS_DIR) or None)
        self._optimizer = optimizer
        self._scheduler = scheduler
        self._checkpoints = checkpoints
        self._group = process_group
        self.sync_every: int = config.sync_every  # type: ignore[assignment]  # resolved
        # What the training thread writes and the shipper reads (or the shipper fills in for
        # it): one object, exporters/rank/counters.py. With a checkpoint manager they are the
        # manager's own, which counts its failed saves into them.
        self._counters = checkpoints.counters if checkpoints is not None else RankCounters()
        wall_offset = time.time() - time.perf_counter()
        # Goodput (exporters/rank/goodput.py): this process's seconds from its start,
        # counted by the shipper thread from the step reports and the checkpoint manager.
        started = time.perf_counter() - (goodput.process_age() or 0.0)
        self._shared = RankShared(
            buffer=deque(maxlen=config.buffer_size), counters=self._counters,
            incarnation=self.incarnation, collectives=collectives,
            goodput=goodput.RankAccount(started, checkpoints, self.info.local_rank,
                                       self.info.job),
            wall_offset=wall_offset, command_types=self._command_types,
            schemas=self._schemas, cuda_memory=self._cuda_memory)
        self._buffer = self._shared.buffer  # the hot path's own reference: one lookup less
        self._seq = 0
        self._model_flops: ModelFlops | None = None  # set_model_flops (MFU)
        self._applied_ids: set[str] = set()
        self._applied_log: dict[str, dict[str, Any]] = {}  # id -> outcome, newest last
        self._known: dict[str, dict[str, Any]] = {}
        # Data position and non-finite losses by report sequence number (the shipper fills
        # the shared nonfinite_seqs for floats and tensors alike), so a rollback knows the
        # batch the failure was first seen at; _health_mark is the count seen at the last
        # checkpoint.
        # _batch is the first batch taken since the previous report: a step that reads
        # several (gradient accumulation) is known by its first, where a skip must start.
        self._own_state = TrainState()
        self._batch: int | None = None
        self._bad_scan = (-1, None)  # (nonfinite_seen when scanned, first bad batch then)
        self._batch_by_seq: deque[tuple[int, int]] = deque(maxlen=4096)
        self._health_mark = 0
        self._rollback_seq = 0
        self._incoming: deque[dict[str, Any]] = deque(maxlen=1000)
        self._custom: dict[str, tuple[CommandHandler, dict[str, Any]]] = {}
        self._last_loss: float | None = None
        self._cuda_device = config.cuda_device
        self._closed = False

        poller = None
        if config.control and config.socket_path:
            poller = ControlPoller(catalog.command_socket(config.socket_path), self.info.job,
                                   self.info.rank)
        all_forwarders: list[Forwarder] = list(forwarders or [])
        if config.tensorboard_dir:
            all_forwarders.append(TensorBoardForwarder(config.tensorboard_dir))
        if config.mlflow_run_id:
            all_forwarders.append(MlflowForwarder(config.mlflow_run_id,
                                                  config.mlflow_tracking_uri))
        self._forwarders = ForwarderThread(all_forwarders) if all_forwarders else None
        if self._forwarders:
            self._forwarders.start()
        self._shipper = Shipper(self._shared, self.info, config.socket_path, poller,
                                self._forwarders, config.flush_interval, config.poll_interval,
                                self._incoming.append)
        self._shipper.start()
        if checkpoints is not None:
            checkpoints.health = self._healthy_since_last_save
            checkpoints.goodput_wake = self._shipper.wake.set
        # Ending without a clean finish is said in a last datagram: at interpreter exit (an
        # exception, often a collective that raised because a peer died) and on SIGTERM (how
        # torchrun stops the others when one rank dies): exporters/rank/departure.py.
        ref = weakref.ref(self)
        atexit.register(_leave_at_exit, ref)
        departure.on_terminate(lambda: _leave_at_exit(ref, timeout=1.0))

    # --- hot path (training thread) -------------------------------------------------------
    def report(self, step: int, loss: Any = None, lr: Any = None, grad_norm: Any = None,
               samples: float | None = None, tokens: float | None = None,
               data_wait: float | None = None, step_time: float | None = None,
               batch: int | None = None) -> None:
        """Record one step. Never blocks, never raises for bad values, never does I/O.

        Pass Python floats where you have them (`loss.item()` is usually computed anyway);
        tensors are accepted and converted on the background thread. `lr` defaults to the
        optimizer's first param group; `step_time` to the time since the previous report.
        `batch` is the data position this step trained on, when the loop knows it better than
        the last `next_batch()` (a framework that fetches ahead).
        """
        now = time.perf_counter()
        shared = self._shared
        if step_time is None and shared.last_report is not None:
            step_time = now - shared.last_report
        shared.last_report = now
        if lr is None and self._optimizer is not None:
            lr = self._optimizer.param_groups[0]["lr"]
        counters = self._counters
        if samples:
            counters.samples_total += samples
        if tokens:
            counters.tokens_total += tokens
        if self._model_flops is not None:
            counters.flops_total += self._model_flops.of(samples, tokens)
        if type(loss) is float:
            self._last_loss = loss
            if loss - loss != 0.0:  # NaN or +-Inf: count now, ship now
                counters.nonfinite_reported += 1
                self._shipper.wake.set()
        self._seq += 1
        if batch is not None:  # the caller knows the step's first batch better
            self._batch = batch
        if self._batch is not None:
            self._batch_by_seq.append((self._seq, self._batch))
            self._batch = None
        self._buffer.append((self._seq, step, now, step_time, loss, lr, grad_norm, data_wait))

    def set_model_flops(self, flops: ModelFlops, *, peak_flops: float | None = None,
                        dtype: object = "bf16", device_name: str | None = None) -> None:
        """Report model FLOPs (exporter: training_model_flops_total) and this rank's peak
        FLOP/s (training_peak_flops_per_second), from which the rules compute MFU.

        The peak is `peak_flops` if given, else looked up for this rank's CUDA device (or
        `device_name`) and `dtype` in exporters/rank/flops.py's datasheet table; unknown
        (CPU, an unlisted GPU): no peak series, so MFU is absent while FLOP/s is not.
        """
        if peak_flops is None:
            name = device_name if device_name is not None else self._device_name()
            peak_flops = flops_table.peak_flops(name, dtype) if name else None
        self._counters.peak_flops = float(peak_flops or 0.0)
        self._model_flops = flops

    def _device_name(self) -> str | None:
        """This rank's CUDA device name, None without CUDA (a CPU job has no GPU peak)."""
        import sys

        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return None
        device = self._cuda_device if self._cuda_device is not None else self.info.local_rank
        return str(torch.cuda.get_device_name(device))

    # --- data position ----------------------------------------------------------------------
    @property
    def train_state(self) -> TrainState:
        """The job-wide state (data position, skip list, command effects); the checkpoint
        manager's when there is one, so it rides in every checkpoint."""
        return self._checkpoints.state if self._checkpoints is not None else self._own_state

    def next_batch(self) -> int:
        """Which batch to read for this step: the data position, past any skipped range.

        Call before `report`, once per batch the step trains on (several under gradient
        accumulation: the step is known by its first, where a skip starts); the index is
        global (the same on every rank) and each rank maps it to its own shard. Restored by
        rollback and restart; batches a rollback skipped are never returned again.
        """
        index = self.train_state.take_batch()
        if self._batch is None:
            self._batch = index
        return index

    def _drained(self, timeout: float = 10.0) -> bool:
        """Wait until the shipper has looked at every report made so far (losses given as
        tensors are only recognised as non-finite there)."""
        shipper = self._shipper
        deadline = time.monotonic() + timeout
        with shipper.caught_up:  # held from the check to the wait: no notify is missed
            while shipper.is_alive() and shipper.seen_seq < self._seq:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                shipper.wake.set()
                # woken when the shipper drained; the short cap notices a shipper that died
                shipper.caught_up.wait(min(remaining, 0.05))
        return True

    def _healthy_since_last_save(self) -> bool:
        """The checkpoint health flag: no non-finite loss (float, tensor or numpy) reported
        since the previous checkpoint. Unconfirmable (shipper stuck) counts as unhealthy."""
        drained = self._drained()
        seen = self._shared.nonfinite_seen
        healthy = drained and seen == self._health_mark
        self._health_mark = seen
        return healthy

    def _first_bad_batch(self) -> int | None:
        """This rank's first batch of the earliest step with a non-finite loss since the last
        rollback, from what the shipper has looked at so far (no waiting). Rescanned only
        when the shipper saw another non-finite loss: a sync step pays one comparison."""
        seen = self._shared.nonfinite_seen
        if self._bad_scan[0] == seen:
            return self._bad_scan[1]
        bad = sorted(q for q in list(self._shared.nonfinite_seqs) if q > self._rollback_seq)
        found = None
        if bad:
            batches = dict(self._batch_by_seq)
            found = next((batches[q] for q in bad if q in batches), None)
        self._bad_scan = (seen, found)
        return found

    def _failure_batches(self) -> tuple[int | None, int | None]:
        """(first bad batch since the last rollback: this rank's, after waiting for the
        shipper to look at every report, or the agreed durable one, the earlier; the batch
        of the newest report, where the failure was seen when no loss was non-finite)."""
        self._drained()
        known = [b for b in (self._first_bad_batch(), self.train_state.bad_batch)
                 if b is not None]
        newest = self._batch_by_seq[-1][1] if self._batch_by_seq else None
        return (min(known) if known else None), newest

    def _agree_bad_batch(self) -> None:
        """Adopt the earliest first bad batch over ranks (from this sync step's all-reduce)
        into the training state and journal it, so a rollback after a restart skips from
        it. Rare: once per failure."""
        agreed = self._agreement.mark
        state = self.train_state
        if agreed is None or agreed == state.bad_batch:
            return
        state.bad_batch = agreed
        self._journal()

    def _journal(self) -> None:
        if self._checkpoints is not None:
            try:
                self._checkpoints.journal_effects()
            except OSError as exc:  # the effect holds in memory and rides in the next save
                log.error("cannot journal command effects in %s: %s",
                          self._checkpoints.directory, exc)

    def step_end(self, step: int) -> Control:
        """Call once per step on every rank, after `report`. Applies agreed commands.

        Every `sync_every` steps this is a collective over the process group: all ranks
        must call it with the same step.
        """
        if step % self.sync_every != 0 or self._closed:
            return Control(next_step=step + 1)
        durable = self.train_state.applied  # applied ids that survive restarts
        while self._incoming:
            command = self._incoming.popleft()
            if command["id"] not in self._applied_ids and command["id"] not in durable:
                self._known.setdefault(command["id"], command)
            elif command["id"] in self._applied_log or command["id"] in durable:
                # Offered again (an exporter that restarted and got it re-posted, or a job
                # that restarted): never re-apply, but report the outcome again so its status
                # is not stuck pending.
                outcome = self._applied_log.get(command["id"]) or durable[command["id"]]
                self._shared.applied_events.append((time.monotonic(), outcome))
        mine = [b for b in (self._first_bad_batch(), self.train_state.bad_batch)
                if b is not None]
        gathered = self._agreement.exchange(list(self._known.values()),
                                            min(mine) if mine else None)
        self._agree_bad_batch()
        agreed = sync.union(gathered, self._applied_ids | set(durable))
        control = Control(next_step=step + 1)
        for command in agreed:
            self._apply(command, step, control)
        return control

    # --- commands -------------------------------------------------------------------------
    def register_command(self, name: str, handler: CommandHandler,
                         schema: dict[str, Any] | None = None) -> None:
        """Accept a script-defined command type; the exporter learns it (and its args schema)
        from this rank's datagrams and rejects other types with 400.

        `handler(args, step)` runs on the training thread at the agreed step on every rank.
        """
        self._custom[name] = (handler, cmd.check_custom_schema(name, schema))

    def _schemas(self) -> dict[str, dict[str, Any]]:
        return {**cmd.BUILTIN_SCHEMAS, **self._command_types()}

    def _command_types(self) -> dict[str, dict[str, Any]]:
        """The script's own command types and their argument schemas (register_command)."""
        return {name: schema for name, (_, schema) in self._custom.items()}

    def _apply(self, command: dict[str, Any], step: int, control: Control) -> None:
        command_id = command["id"]
        self._applied_ids.add(command_id)
        self._known.pop(command_id, None)
        event: dict[str, Any] = {"id": command_id, "type": command.get("type"),
                                 "args": command.get("args") or {}, "step": step}
        try:
            checked = cmd.validate({"id": command_id, "type": command.get("type"),
                                    "args": command.get("args") or {}}, self._schemas())
            result = self._run(checked, step, control)
            event.update(status="applied", result=result)
            counts = self._counters.applied_counts
            counts[checked.type] = counts.get(checked.type, 0) + 1
        except Exception as exc:  # a failed command is reported, not raised
            log.warning("command %s (%s) failed at step %d: %s", command_id,
                        command.get("type"), step, exc)
            event.update(status="failed", error=str(exc)[:500])
            if not cmd.COMMAND_TYPE_PATTERN.match(str(event["type"])):
                event["type"] = "invalid"
        control.applied.append(event)
        self._shared.applied_events.append((time.monotonic(), event))
        self._applied_log[command_id] = event
        while len(self._applied_log) > 1000:
            self._applied_log.pop(next(iter(self._applied_log)))
        self.train_state.record_applied(command_id, event)
        self._journal()
        self._shipper.wake.set()

    def _run(self, command: cmd.Command, step: int, control: Control) -> Any:
        args = command.args
        if command.type == cmd.SCALE_LR:
            return self._scale_lr(float(args["factor"]), float(args.get("floor", 0.0)))
        if command.type == cmd.ROLLBACK:
            if self._checkpoints is None:
                raise RuntimeError("no CheckpointManager given to TrainingMonitor")
            return self._rollback(int(args.get("skip_batches", 0)),
                                  args.get("skip_from_batch"), control)
        if command.type == cmd.CHECKPOINT:
            if self._checkpoints is None:
                raise RuntimeError("no CheckpointManager given to TrainingMonitor")
            return {"path": str(self._checkpoints.save(step, loss=self._last_loss))}
        handler, _ = self._custom[command.type]
        if self._checkpoints is not None:  # a handler may change weights in place: the
            self._checkpoints.wait_staged()  # save in flight keeps the state at save()
        return handler(args, step)

    def _rollback(self, skip: int, skip_from: int | None, control: Control) -> dict[str, Any]:
        """One decision for all ranks (CheckpointManager.rollback), then skip the bad data:
        `skip` batches from the first batch of the first step whose loss was non-finite
        (agreed across ranks: the earliest any rank saw; durable, so also after a restart),
        else from the newest step's first batch (the failure was seen now), or from
        `skip_from` when the playbook names the window. A first bad batch before the restored
        data position is stale (a healthy checkpoint was taken after it) and not used.
        The agreement runs on the Agreement's group (a side gloo group on NCCL)."""
        bad = newest = None
        if skip and skip_from is None:
            bad, newest = self._agreement.min_over_ranks(list(self._failure_batches()))
        restored = self._checkpoints.rollback()  # raises on every rank alike
        self._counters.rollbacks += 1
        self._rollback_seq = self._seq
        self._health_mark = self._shared.nonfinite_seen
        self._bad_scan = (-1, None)
        self.train_state.bad_batch = None  # used (or stale): the next failure sets it anew
        control.rolled_back = True
        control.next_step = restored.step + 1
        position = self.train_state.next_batch
        if skip_from is not None:
            start = int(skip_from)
        else:
            start = bad if bad is not None and bad >= position else newest
        window = None
        if skip and start is not None:
            window = self.train_state.add_skip(start, skip)
        elif skip:  # the loop does not use next_batch(): it skips by itself (legacy)
            control.skip_batches += skip
        return {"restored_step": restored.step, "skipped": window,
                "next_batch": self.train_state.next_batch}

    def _scale_lr(self, factor: float, floor: float) -> dict[str, Any]:
        if self._optimizer is None:
            raise RuntimeError("no optimizer given to TrainingMonitor")
        state = self.train_state
        state.lr_multiplier *= factor
        state.lr_floor = max(state.lr_floor, floor)
        for group in self._optimizer.param_groups:
            group["lr"] = max(group["lr"] * factor, floor)
        if self._scheduler is not None and hasattr(self._scheduler, "base_lrs"):
            self._scheduler.base_lrs = [max(lr * factor, floor)
                                        for lr in self._scheduler.base_lrs]
        return {"lr": self._optimizer.param_groups[0]["lr"]}

    # --- lifecycle ------------------------------------------------------------------------
    def _cuda_memory(self) -> list[float] | None:
        """Allocated/reserved bytes when this process uses CUDA (read on the shipper)."""
        import sys

        torch = sys.modules.get("torch")
        try:  # torch may be absent, half-imported by the main thread, or CPU-only
            if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
                return None
            device = self._cuda_device if self._cuda_device is not None else self.info.local_rank
            return [float(torch.cuda.memory_allocated(device)),
                    float(torch.cuda.memory_reserved(device))]
        except Exception:
            return None

    def stats(self) -> dict[str, Any]:
        """Delivery figures for this rank (also what a run summary should print)."""
        counters = self._counters
        return {"reported": self._seq, "dropped": counters.dropped,
                "nonfinite": counters.nonfinite,
                "datagrams_sent": self._shipper.datagrams_sent,
                "poll_errors": self._shipper.poll_errors,
                "forward_dropped_batches": (self._forwarders.dropped_batches
                                            if self._forwarders else 0),
                "applied": dict(counters.applied_counts), "rollbacks": counters.rollbacks}

    def close(self, timeout: float = 10.0, *, finished: bool = True) -> None:
        """Flush what is buffered (one last datagram) and stop the background threads.

        `finished=False` (an exception left the `with` block, or the process exits without
        closing): the last datagram goes out as a heartbeat of a rank that did not finish.
        When a peer is killed, the ranks that die of it (a collective raising) say so after
        it stopped, so the rank whose heartbeat stopped first is the one that was killed."""
        if self._closed:
            return
        self._closed = True
        # The last datagram says so: a clean end, not a vanished job, or an end on an error
        # (a peer's death, an exception).
        self._shared.finished, self._shared.exiting = finished, not finished
        self._shipper.stop(timeout)
        if self._forwarders is not None:
            self._forwarders.close(timeout)

    @property
    def finished(self) -> bool:
        """Closed with a clean finish (what the last datagram said)."""
        return self._shared.finished

    @property
    def exiting(self) -> bool:
        """Closed without a clean finish (an exception, SIGTERM, interpreter exit)."""
        return self._shared.exiting

    def __enter__(self) -> TrainingMonitor:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(finished=exc_type is None)


def _leave_at_exit(ref: weakref.ref[TrainingMonitor], timeout: float = 2.0) -> None:
    """At interpreter exit (also after an uncaught exception: a collective that raised
    because a peer died) or on SIGTERM, send the last datagram of a monitor nobody closed.
    A close already under way (atexit's, when torchrun's SIGTERM lands in it) is waited for
    until its last datagram is out, within `timeout`: the process dies right after this, and
    a rank whose last word is lost reads as the killed one (a suite run lost rank 1's)."""
    monitor = ref()
    if monitor is None:
        return
    if not monitor._closed:
        monitor.close(timeout=timeout, finished=False)
    elif monitor._shipper.is_alive():
        monitor._shipper.join(timeout)

