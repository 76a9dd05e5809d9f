"""Trainwatch alerting and recording rules, generated from alert_rules/config.yml.

Run `python -m alert_rules.generate` to rewrite alert_rules/generated/<profile>/*.yml.
"""
