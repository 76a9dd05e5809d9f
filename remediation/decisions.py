"""Every decision the audit records, in one place: intake's, the engine's, an action's rails',
the approval API's and the resume command's. A `StrEnum`, so a decision compares equal to the
text stored in the audit and shown by the API and the CLI."""

from __future__ import annotations

from enum import StrEnum


class Decision(StrEnum):
    # intake (trainwatch.remediation.ingest)
    INVALID = "invalid"
    UNMATCHED = "unmatched"
    DEDUPLICATED = "deduplicated"
    RESOLVED_RECORDED = "resolved_recorded"
    TRUNCATED_ESCALATED = "truncated_escalated"
    # the engine's decision (trainwatch.remediation.engine)
    ACT = "act"
    RESOLVE_ACT = "resolve_act"
    DEFERRED = "deferred"
    REFUSED = "refused"
    DRY_RUN = "dry_run"
    AWAITING_APPROVAL = "awaiting_approval"
    COOLED_DOWN = "cooled_down"
    RATE_LIMITED = "rate_limited"
    CANCELLED = "cancelled"
    # after the steps (trainwatch.remediation.lifecycle)
    ACTED = "acted"
    FAILED = "failed"
    RETRIED = "retried"  # a failed intent whose alert was delivered again, still firing
    # an action's rails (trainwatch.remediation.actions.*)
    OBSERVE_ONLY = "observe_only"
    ALREADY_QUARANTINED = "already_quarantined"
    NOT_ACTIONABLE = "not_actionable"
    RESTART_LIMITED = "restart_limited"
    ALREADY_RESTARTED = "already_restarted"  # the job was restarted after this fault began
    # a rule alert of a node the same event's fast alert drained (the node may be back since)
    ALREADY_HEALED = "already_healed"
    NODE_NOT_OURS = "node_not_ours"  # a node someone else has out of service (also resume's)
    # a hold that outlived its alert and was never decided
    EXPIRED = "expired"
    # the approval API
    APPROVED = "approved"
    REJECTED = "rejected"
    # trainwatch-resume-node
    NODE_RESUMED = "node_resumed"
    NODE_RESUME_REFUSED = "node_resume_refused"


# The decisions the engine's run goes on from: the steps (or on_resolve steps) run.
RUNS_STEPS = frozenset({Decision.ACT, Decision.RESOLVE_ACT})
