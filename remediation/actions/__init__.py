"""Typed remediation actions, one module each; `registry.ACTIONS` maps a step's `action` to
its runner.

Every runner has the signature `run(step, ctx) -> dict` (a JSON-able result for the audit) and
raises base.ActionError on failure. Runners must be safe to repeat: a crash between doing the
work and recording it makes the worker run the step again, so each passes an idempotency key.
"""
