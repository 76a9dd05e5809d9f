"""The exporter's own exposition text, process metrics and HTTP server, checked against the
real things: prometheus_client's generate_latest and ProcessCollector, promtool, a socket.

The exporter avoids importing prometheus_client and the ssl-pulling HTTP modules for RSS
(exporters/node/gpu/text_format.py); these tests pin that its output did not change.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import sys

import pytest
import requests
from prometheus_client import generate_latest
from prometheus_client.process_collector import ProcessCollector

from tests.gpu.helpers import make_loop, static_fake
from tests.support.net import free_port
from trainwatch.exporters.node.gpu.exposition import GpuCollector
from trainwatch.exporters.node.gpu.http_server import MAX_LINE, ExpositionApp, serve
from trainwatch.exporters.node.gpu.process_metrics import ProcessMetrics
from trainwatch.exporters.node.gpu.text_format import counter, gauge, render


class _Families:
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


def test_render_is_byte_identical_to_prometheus_client_for_the_8_gpu_exposition() -> None:
    loop = make_loop(static_fake(8))
    loop.run_once()
    loop.run_once()
    collector = GpuCollector(loop, True)
    families = list(collector.collect())
    assert render(families) == generate_latest(_Families(families))  # type: ignore[arg-type]


def test_render_escapes_and_formats_edge_values_like_prometheus_client() -> None:
    odd = gauge("t_gauge", 'help with \\ backslash\nand newline "quoted"', labels=["b", "a"])
    for i, number in enumerate([0.0, -1.5, 1e-9, 123456789.0, 1e21, 2.5e7, math.inf,
                                -math.inf, math.nan, 7]):
        odd.add_metric([f'v"{i}\\\n', "ü"], number)
    count = counter("t_events_total", "events", labels=["kind"])
    count.add_metric(["x"], 3)
    plain = gauge("t_plain", "no labels", value=1.0)
    families = [odd, count, plain]
    assert render(families) == generate_latest(_Families(families))  # type: ignore[arg-type]


def test_process_metrics_match_prometheus_client_process_collector() -> None:
    ours = {f.name: (f.type, f.documentation) for f in ProcessMetrics().collect()}
    theirs = {f.name: (f.type, f.documentation)
              for f in ProcessCollector(registry=None).collect()}
    assert ours == theirs
    assert len(ours) == 6


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_served_text_passes_promtool_check_metrics() -> None:
    loop = make_loop(static_fake(8))
    loop.run_once()
    loop.run_once()
    text = ExpositionApp(GpuCollector(loop, True)).render()
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_http_server_answers_metrics_and_refuses_everything_else() -> None:
    loop = make_loop(static_fake(1))
    loop.run_once()
    port = free_port()
    server, _ = serve(ExpositionApp(GpuCollector(loop, True)), "127.0.0.1", port)
    try:
        response = requests.get(f"http://127.0.0.1:{port}/metrics?x=1", timeout=10)
        assert response.status_code == 200
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert "trainwatch_gpu_up" in response.text and "process_cpu_seconds_total" in response.text
        head = requests.head(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert head.status_code == 200 and head.content == b""
        assert int(head.headers["Content-Length"]) > 1000
        assert requests.get(f"http://127.0.0.1:{port}/other", timeout=10).status_code == 404
        assert requests.post(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 405
        assert _raw(port, b"garbage\r\n\r\n").startswith(b"HTTP/1.0 400 ")
        assert _raw(port, b"GET /" + b"a" * MAX_LINE + b" HTTP/1.1\r\n\r\n").startswith(
            b"HTTP/1.0 400 ")
        assert _raw(port, b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n").startswith(
            b"HTTP/1.0 400 ")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
            # a client that connects and says nothing holds only its own thread
            assert requests.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 200
            idle.sendall(b"")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("simulate", [2, 0])
def test_serving_process_imports_neither_prometheus_client_nor_ssl(simulate: int) -> None:
    """What keeps the exporter's own RSS small (docs/performance.md): the serving path loads
    no prometheus_client, ssl, http.client/email or OpenSSL hashes, and on a real host (no
    --simulate; pynvml, whose init fails here without a driver) not the fake NVML either."""
    script = f"""
import json, os, sys
os.environ.pop("TRAINWATCH_FAKE_NVML", None)
from trainwatch.exporters.node.gpu.cli import build
from trainwatch.exporters.node.gpu.config import build_parser, resolve
from trainwatch.exporters.node.gpu.nvml_source import load_nvml
settings = resolve(build_parser().parse_args(["--simulate", "{simulate}"] if {simulate} else []))
nvml, simulated = load_nvml(settings.simulate)
loop, app = build(settings, nvml, simulated)
loop.run_once()
assert b"trainwatch_gpu_exporter_nvml_up" in app.render()
print(json.dumps(sorted(sys.modules)))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=True)
    loaded = set(json.loads(result.stdout))
    heavy = {"prometheus_client", "ssl", "_ssl", "http.client", "email", "hashlib", "_hashlib",
             "wsgiref", "yaml", "jsonschema"}
    assert not heavy & loaded
    assert ("trainwatch.exporters.node.gpu.fake_nvml" in loaded) == bool(simulate)
