"""Trainwatch remediation service: Alertmanager webhook -> durable intents -> audited playbooks."""
