"""NVML GPU exporter: background collection, snapshot-serving Prometheus collector, fake NVML.

Modules, one job each: `metrics` (names), `snapshot` (immutable data a scrape serves),
`reader` (one NVML collection cycle), `collector_loop` (background thread, init backoff,
staleness), `xid` (NVML event thread), `processes` (job/rank attribution from /proc),
`exposition` (prometheus_client Collector), `fake_nvml` (tests and `--simulate`),
`config`/`cli` (the `gpu-exporter` command), `power_limit` (remediation tool).
"""
