"""NVML GPU exporter: background collection, snapshot-serving Prometheus collector, fake NVML.

Modules, one job each: `snapshot` (immutable data a scrape serves),
`reader` (one NVML collection cycle), `collector_loop` (background thread, init backoff,
staleness), `xid` (NVML event thread), `processes` (job/rank attribution from /proc),
`exposition` (metric families per snapshot), `text_format` (exposition text without
prometheus_client: RSS), `process_metrics` (process_* series), `http_server` (/metrics over
socketserver, text cached per snapshot), `nvml_source` (real or fake NVML), `fake_nvml`
(tests and `--simulate`), `config`/`cli` (the `gpu-exporter` command), `compare_nvidia_smi`
(check on a GPU host). The power-limit tool remediation runs is in
`trainwatch.exporters.node.tools`.
See docs/gpu_exporter.md.
"""
