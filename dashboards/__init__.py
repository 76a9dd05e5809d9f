"""Trainwatch Grafana dashboards, generated from Python with grafana-foundation-sdk.

`python -m dashboards.generate` writes dashboards/generated/*.json and the file-provisioning
configs in dashboards/provisioning/. See dashboards/README.md.
"""
