"""Node-side code: what runs on a GPU node beside the training job, never inside a rank.

`gpu` (the NVML GPU exporter), `training` (the training exporter: datagram receiver, per-job
store, Prometheus collector, control API, server), `logs` (the log scanner that turns failure
lines into metrics) and `tools` (what remediation playbooks run on the node: disk cleanup, stack
dumps, GPU power limits).
"""
