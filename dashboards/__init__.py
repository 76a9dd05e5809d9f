"""Trainwatch Grafana dashboards, generated from Python with grafana-foundation-sdk.

`python -m scripts.build` writes dashboards/generated/*.json; Grafana's provisioning
files come from the Ansible grafana role's templates. See dashboards/README.md.
"""
