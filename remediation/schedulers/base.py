"""What the quarantine action needs from a scheduler, whichever it is.

The operations are idempotent by construction, because an action step may run again after a
crash: drain reports `already` when the node is already drained with Trainwatch's reason,
requeue only touches a job that is still running, resume only a node that is drained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# Every drain reason Trainwatch writes starts with this; a node drained for another reason
# (by a human, by Slurm itself) is never resumed or re-drained by Trainwatch.
REASON_PREFIX = "trainwatch:"


class SchedulerError(RuntimeError):
    """A scheduler command failed or answered something unexpected; the message is for the
    audit record."""


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  # the scheduler's word, lower case: idle, allocated, mixed, drained, down...
    reason: str
    since: str = ""  # when the reason was set, as the scheduler prints it (ISO 8601, local)

    @property
    def in_service(self) -> bool:
        """Can run jobs now or after its current ones (not drained, draining, down or failed)."""
        return not any(word in self.state for word in ("drain", "down", "fail", "maint",
                                                       "reserved", "unknown", "not_responding"))

    @property
    def drained_by_trainwatch(self) -> bool:
        return "drain" in self.state and self.reason.startswith(REASON_PREFIX)


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

    def requeue_ended(self, job: Job) -> dict[str, object]: ...

    def resume(self, node: str) -> dict[str, object]: ...
