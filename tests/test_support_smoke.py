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


def test_free_port_falls_back_to_the_kernel_when_its_slice_is_used_up(monkeypatch) -> None:
    """A worker whose slice is all given out must still get a port, not loop forever."""
    import threading

    from tests.support import net

    small = range(20000, 20100)
    monkeypatch.setattr(net, "_worker_slice", lambda low, high: small)
    monkeypatch.setattr(net, "_issued", set(small))
    got: list[int] = []
    worker = threading.Thread(target=lambda: got.append(net.free_port()), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "free_port kept looping over a used-up slice"
    assert got and got[0] not in small
