"""Background thread of a rank: ship step reports as datagrams, poll the command socket.

Everything slow or failure-prone happens here: number conversion, JSON encoding, socket
sends, HTTP. Sends are non-blocking; a datagram that cannot be sent (exporter down, socket
full) is dropped and its steps counted, and the cumulative count rides in the next datagram
that gets through.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from trainwatch.exporters.contract import commands as cmd
from trainwatch.exporters.contract.catalog import ENV_EXPORTER_SOCKET
from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.contract.wire import MAX_STEPS_PER_DATAGRAM, VERSION, encode
from trainwatch.exporters.rank.counters import RankShared
from trainwatch.exporters.rank.forwarders import ForwarderThread, StepRow

log = logging.getLogger(__name__)
APPLIED_RESEND_SECONDS = 10.0  # applied reports ride along this long (datagrams may drop)
# A rank with nothing to report (blocked in a collective, loading) still sends this often: the
# goodput ledger knows an incarnation's end (a rank killed while it waited) to within it, and
# a blocked rank's four datagrams a second cost its node's exporter well under 1 % of a core.
HEARTBEAT_SECONDS = 0.25
MAX_ANSWER_BYTES = 1 << 20


def _float(value: Any) -> float | None:
    """Numbers and 0-d tensors to float; anything unconvertible to None (never raise)."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


class ControlPoller:
    """Asks the node exporter's command socket for the commands this rank has not applied.

    The exporter answers only a process of the job (it checks the connection's kernel
    credentials against the job's reports): the rank holds no token."""

    def __init__(self, path: str, job: str, rank: int, timeout: float = 2.0) -> None:
        self._path = path
        self._request = json.dumps({"job": job, "rank": rank}).encode() + b"\n"
        self._timeout = timeout

    def fetch(self) -> list[dict[str, Any]]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(self._timeout)
            conn.connect(self._path)
            conn.sendall(self._request)
            body = b""
            while len(body) <= MAX_ANSWER_BYTES:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                body += chunk
        # NaN/Infinity literals parse here on purpose: cmd.validate refuses that one entry
        # (non-finite argument) and the commands beside it still arrive.
        document = json.loads(body)
        if not isinstance(document, dict):
            raise ValueError("command socket answered no JSON object")
        if "error" in document:
            raise OSError(f"command socket refused: {document['error']}")
        commands = document.get("commands", [])
        return commands if isinstance(commands, list) else []


class Shipper(threading.Thread):
    """Drains the monitor's buffer every `flush_interval` (or at once when woken).

    It sees the monitor only through `shared` (exporters/rank/counters.py): what it reads
    and what it fills in for the monitor are written down there."""

    def __init__(self, shared: RankShared, info: RankInfo, socket_path: str | None,
                 poller: ControlPoller | None, forwarders: ForwarderThread | None,
                 flush_interval: float, poll_interval: float,
                 accept_command: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(name="trainwatch-shipper", daemon=True)
        self._shared = shared
        self._counters = shared.counters
        self._info = info
        self._path = socket_path
        self._poller = poller
        self._forwarders = forwarders
        self._flush_interval = flush_interval
        self._poll_interval = poll_interval
        self._accept = accept_command
        self.wake = threading.Event()
        self._stopping = False
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._expected_seq = 1
        self._last_send = 0.0
        self._last_poll = 0.0
        self.seen_seq = 0  # newest report looked at (the monitor waits on it for health)
        # notified each time seen_seq moves, so a save's health check waits exactly as long
        # as the drain takes (polling it cost the training thread a millisecond per save)
        self.caught_up = threading.Condition()
        self.datagrams_sent = 0
        self.poll_errors = 0
        self._unreachable_said = False  # the job's log names a lost exporter once, not per send

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self.wake.set()
        self.join(timeout)
        self._sock.close()

    def run(self) -> None:
        while True:
            self.wake.wait(self._flush_interval)
            self.wake.clear()
            stopping = self._stopping
            try:
                self._flush(force=stopping)
                if self._poller is not None and not stopping:
                    self._poll()
            except Exception:  # the thread must survive anything
                log.exception("trainwatch shipper iteration failed")
            if stopping:
                return

    # --- step reports -----------------------------------------------------------------------
    def _drain(self) -> list[StepRow]:
        shared, counters = self._shared, self._counters
        buffer = shared.buffer
        offset = shared.wall_offset
        compute, goodput = shared.collectives.compute, shared.goodput
        rows: list[StepRow] = []
        while True:
            try:
                seq, step, t, duration, loss, lr, grad_norm, data_wait = buffer.popleft()
            except IndexError:
                break
            if seq > self._expected_seq:  # the deque overflowed and discarded the oldest
                counters.dropped += seq - self._expected_seq
            self._expected_seq = seq + 1
            loss_f = _float(loss)
            if loss_f is not None and not math.isfinite(loss_f):
                # Floats were counted on the training thread already; tensors and numpy
                # scalars only here. Both feed the checkpoint health flag and rollback's skip.
                if type(loss) is not float:
                    counters.nonfinite_late += 1
                shared.nonfinite_seqs.append(seq)
                shared.nonfinite_seen += 1
            self.seen_seq = seq
            compute.note_report(t + offset)
            goodput.step(t, data_wait if type(data_wait) is float else _float(data_wait))
            rows.append((int(step), t + offset, _float(duration), loss_f, _float(lr),
                         _float(grad_norm), _float(data_wait)))
        if rows:
            with self.caught_up:
                self.caught_up.notify_all()
        return rows

    def _header(self) -> dict[str, Any]:
        shared, info = self._shared, self._info
        collectives = shared.collectives
        now = time.monotonic()
        applied = [e for t, e in list(shared.applied_events) if now - t < APPLIED_RESEND_SECONDS]
        return {
            "v": VERSION, "job": info.job, "rank": info.rank, "local_rank": info.local_rank,
            "world_size": info.world_size, "restarts": info.restarts,
            **self._counters.wire(),
            "applied_counts": dict(self._counters.applied_counts),
            "command_types": shared.command_types(),
            "cuda": shared.cuda_memory(), "applied": applied[-50:],
            "incarnation": shared.incarnation, "finished": shared.finished,
            "exiting": shared.exiting,
            "collective": collectives.current(shared.last_report),
            "collective_key": collectives.key,  # of the collective just described
            "compute": [collectives.compute.seconds, collectives.compute.steps],
            "goodput": shared.goodput.wire(time.perf_counter()),
        }

    def _flush(self, force: bool = False) -> None:
        rows = self._drain()
        shared = self._shared
        # a save that ended since the last report: its mark goes out now, not a step later
        marked = shared.goodput.mark_saves(lambda: not shared.buffer)
        shared.collectives.compute.measure()
        if force and self._shared.finished:  # the monitor closed: a clean end of this process
            self._shared.goodput.finish(time.perf_counter())
        if rows and self._forwarders is not None:
            self._forwarders.submit(rows)
        now = time.monotonic()
        if not rows and not force and not marked and now - self._last_send < HEARTBEAT_SECONDS:
            return
        self._last_send = now
        if self._path is None:
            self._counters.dropped += len(rows)
            return
        chunks = [rows[i:i + MAX_STEPS_PER_DATAGRAM]
                  for i in range(0, len(rows), MAX_STEPS_PER_DATAGRAM)] or [[]]
        sent = self.datagrams_sent
        for chunk in chunks:
            message = self._header()
            message["steps"] = [list(r) for r in chunk]
            try:
                self._sock.sendto(encode(message), self._path)
                self.datagrams_sent += 1
            except BlockingIOError:  # the exporter is there but behind: drop and count
                self._counters.dropped += len(chunk)
            except OSError as exc:  # absent, refused, not allowed: drop, count, say so once
                self._counters.dropped += len(chunk)
                self._say_unreachable(exc)
        if self.datagrams_sent > sent:
            # the slot's record for a restart on other nodes (lineage.py), once what it says
            # reached the exporter: the record is never newer than the exporter's last word
            self._shared.goodput.keep_record(self._shared.incarnation, force=force)

    def _say_unreachable(self, exc: OSError) -> None:
        """One warning on the job's log for the whole run: steps are being lost and why (a
        missing socket is an exporter that is not running or another path; a refused one a
        user outside the socket's group). Later failures only count (`dropped`)."""
        if self._unreachable_said:
            return
        self._unreachable_said = True
        log.warning("trainwatch: cannot reach the training exporter at %s (%s); step reports "
                    "are dropped and counted until it answers, and this is not logged again. "
                    "Set %s to the node's socket, or ask for the job's user to be in the "
                    "socket's group (docs/deploy.md, 'Jobs').", self._path,
                    exc.strerror or type(exc).__name__, ENV_EXPORTER_SOCKET)

    # --- commands ---------------------------------------------------------------------------
    def _poll(self) -> None:
        now = time.monotonic()
        if now - self._last_poll < self._poll_interval:
            return
        self._last_poll = now
        try:
            fetched = self._poller.fetch()  # type: ignore[union-attr]
        except (OSError, ValueError) as exc:
            self.poll_errors += 1
            log.debug("control poll failed: %s", exc)
            return
        for entry in fetched:
            if isinstance(entry, dict):
                try:
                    command = cmd.validate({k: entry.get(k) for k in ("id", "type", "args")},
                                           self._shared.schemas())
                except cmd.CommandError as exc:
                    log.warning("ignoring command from exporter: %s", exc)
                    continue
                self._accept(command.to_wire())
