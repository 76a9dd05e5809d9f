"""The node training exporter: receives every local rank's datagrams, keeps per-job state,
serves it to Prometheus and relays commands to ranks through its control API."""
