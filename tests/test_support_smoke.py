"""The test helpers themselves: a real Prometheus starts on a free port and stops again."""

from __future__ import annotations

from pathlib import Path

import requests

from tests.support.procs import prometheus


def test_prometheus_starts_on_free_port_and_stops(tmp_path: Path, real_binaries) -> None:
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\nscrape_configs: []\n")
    with prometheus(tmp_path, cfg) as url:
        r = requests.get(f"{url}/api/v1/status/buildinfo", timeout=5)
        assert r.json()["status"] == "success"
        base = url
    try:
        requests.get(f"{base}/-/ready", timeout=1)
        raise AssertionError("Prometheus still answers after the block ended")
    except requests.ConnectionError:
        pass


def test_free_ports_are_never_ones_an_outgoing_connection_could_take() -> None:
    """A port from the kernel's ephemeral range can become the source port of any outgoing
    connection before the test's server binds it (torchrun's rendezvous failed with
    EADDRINUSE that way in a loaded suite run): free_port chooses below that range."""
    from tests.support import net

    start = net._ephemeral_start()
    ports = [net.free_port() for _ in range(20)]
    assert len(set(ports)) == 20
    assert all(1024 <= port < start for port in ports), (start, ports)
