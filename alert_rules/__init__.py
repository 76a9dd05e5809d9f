"""Trainwatch alerting and recording rules, generated from alert_rules/config.yml.

`python -m scripts.build` rewrites alert_rules/generated/<profile>/*.yml (and every other
generated file).
"""
