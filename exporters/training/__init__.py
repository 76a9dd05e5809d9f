"""Training instrumentation: per-rank client, node training exporter, checkpoint manager.

Import `TrainingMonitor` from `exporters.training.client` and `CheckpointManager` from
`exporters.training.checkpoint`; this package module stays import-light so the exporter does
not pull in torch.
"""
