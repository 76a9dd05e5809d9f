"""Typed remediation actions, one module each with an `ACTION` (actions/base.py's interface);
`registry.ACTIONS` finds them by the step's `action`.

Every run step returns a JSON-able result for the audit and raises base.ActionError on
failure. Runs must be safe to repeat: a crash between doing the work and recording it makes
the worker run the step again, so each passes an idempotency key.
"""
