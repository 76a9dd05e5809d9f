"""What the quarantine action needs from a scheduler, whichever it is, and who owns a node.

The operations are idempotent by construction, because an action step may run again after a
crash: drain reports `already` when the node is already drained by Trainwatch, requeue only
touches a job that is still running, resume only a node that Trainwatch drained.

Ownership: a node that is drained, down, failed, in maintenance or reserved belongs to whoever
put it there. Trainwatch owns a drain only when the node's reason, read back from the
scheduler, is one it writes: `trainwatch: <alert> ... intent <id>: ...` (REASON_PREFIX, then
the intent that drained it; `own_reason`). Every other out-of-service node is someone else's
(a person's "PSU swap, burn-in pending", Slurm's own "Not responding"): Trainwatch never
writes a reason over it, never requeues on the strength of it and never resumes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

# Every drain reason Trainwatch writes starts with this and names the intent that drained
# the node (OWN_REASON); a node drained for another reason (by a human, by Slurm itself) is
# never resumed or re-drained by Trainwatch.
REASON_PREFIX = "trainwatch:"
OWN_REASON = re.compile(r"^trainwatch: [^\n]*\bintent ([0-9]{1,12})\b")
# Node states (Slurm's long names, lower case, flags stripped) that can run jobs now or after
# the current ones.
SERVING_STATES = frozenset({"idle", "allocated", "mixed", "completing", "planned"})
# A state Slurm reports before it has heard from the node since slurmctld started: neither in
# nor out of service yet (a node that stays silent becomes `down` after SlurmdTimeout).
UNKNOWN_STATE = "unknown"
# The one-character flags Slurm appends to a long state name (sinfo(1) NODE STATE CODES):
# `*` not responding (yet: transient after a restart), `$` in a maintenance reservation,
# `~ # ! %` power saving, `@ ^` reboot, `-` planned, `+` more states.
STATE_FLAGS = "*$~#!%@^-+"


def own_reason(reason: str) -> int | None:
    """The intent id of a reason Trainwatch wrote; None for anybody else's."""
    match = OWN_REASON.match(reason)
    return int(match.group(1)) if match else None


class SchedulerError(RuntimeError):
    """A scheduler command failed or answered something unexpected (an exit status, output
    that does not parse, a change that does not read back); the message is for the audit
    record. Retried: the scheduler may be away for a while."""


class NodeNotOurs(SchedulerError):
    """The node is out of service by someone else's hand: Trainwatch leaves it alone (never
    retried: the refusal is audited and paged)."""


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # the scheduler's long state, lower case, flags kept: idle, idle*, drained...
    reason: str
    since: str = ""  # when the reason was set, as the scheduler prints it (ISO 8601, local)

    @property
    def base(self) -> str:
        """The state without Slurm's flag characters (`idle*` -> `idle`)."""
        return self.state.strip(STATE_FLAGS)

    @property
    def in_service(self) -> bool:
        """Can run jobs now or after its current ones, or is not known yet to be unable to:
        not drained, draining, down, failed, in maintenance or reserved. A node Slurm calls
        `unknown` or not responding (`*`) right after slurmctld starts counts as in service:
        Slurm itself marks it down if it stays silent."""
        if "$" in self.state or "drain" in self.state:
            return False
        return self.base in SERVING_STATES or self.base == UNKNOWN_STATE

    @property
    def drained_by_trainwatch(self) -> bool:
        return "drain" in self.state and own_reason(self.reason) is not None

    @property
    def someone_elses(self) -> bool:
        """Out of service by another hand than Trainwatch's (a person, Slurm)."""
        return not self.in_service and not self.drained_by_trainwatch

    def as_dict(self) -> dict[str, str]:
        return {"node": self.name, "state": self.state, "reason": self.reason}


@dataclass(frozen=True)
class Job:
    job_id: str  # digits only (checked by the adapter before it is used)
    state: str
    nodes: str  # as the scheduler prints it (for the audit only, never parsed into a command)


class Scheduler(Protocol):
    def node_states(self, nodes: tuple[str, ...]) -> dict[str, NodeState]: ...

    def jobs_on(self, node: str) -> list[Job]: ...

    def drain(self, node: str, reason: str) -> dict[str, object]: ...

    def requeue(self, job: Job) -> dict[str, object]: ...

    # A job that already ended because of a fault (its rank died): found on the node its
    # rank ran on, restarted from its checkpoint.
    def ended_jobs(self, node: str, job_id: str | None = None) -> list[Job]: ...

    # Jobs on the node that are ending now (Slurm's COMPLETING: the epilog runs, the exit
    # code is not their reason yet), in neither jobs_on nor ended_jobs.
    def completing_jobs(self, node: str) -> list[Job]: ...

    def requeue_ended(self, job: Job) -> dict[str, object]: ...

    def resume(self, node: str) -> dict[str, object]: ...


def retry_delay(attempts: int, *, first: float, longest: float, until: float) -> float | None:
    """Seconds to wait before try `attempts + 1` of an intent whose scheduler failed `attempts`
    times (doubling from `first`, at most `longest`), or None once the waits so far add up to
    `until`: the intent then fails and pages. Counted in waits rather than read off a clock,
    so a restart of the service or a clock step neither shortens nor resets it (the real time
    is longer: each failed try adds the command's own time)."""
    waits = [min(first * 2 ** k, longest) for k in range(max(attempts, 1))]
    if sum(waits[:-1]) >= until:
        return None
    return waits[-1]
