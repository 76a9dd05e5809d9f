"""The real `gpu-exporter` process over HTTP (fake NVML via --simulate / TRAINWATCH_FAKE_NVML)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import requests

from tests.gpu.helpers import Series, parse, value, values
from tests.support.net import free_port, wait_until
from tests.support.procs import running
from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.node.gpu.fake_nvml import simulated_scenario
from trainwatch.exporters.node.gpu.nvml_source import ENV_FAKE_NVML

EXPORTER = str(Path(sys.executable).parent / "gpu-exporter")


def scrape(url: str) -> Series:
    response = requests.get(url, timeout=2)  # a scrape must never wait on NVML
    response.raise_for_status()
    return parse(response.text)


def write_atomically(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def test_simulate_8_serves_every_gpu_over_http_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    argv = [EXPORTER, "--bind", "127.0.0.1", "--port", str(port), "--interval", "0.5",
            "--simulate", "8"]
    with running(argv, tmp_path / "exporter.log", ready_url=url) as proc:
        series = wait_until(lambda: (s := scrape(url)) and values(s, c.GPU_UP) and s,
                            timeout=20, what="first snapshot")
        assert values(series, c.GPU_UP) == [1.0] * 8
        assert value(series, c.GPU_EXPORTER_SIMULATED) == 1
        assert value(series, c.GPU_EXPORTER_NVML_UP) == 1
        assert len(values(series, c.GPU_PROCESS_MEMORY, training_job="demo-llm")) == 8
        assert values(series, "process_resident_memory_bytes")
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.proc.wait(timeout=10) == 0
        assert "stopping" in proc.log_text()


def test_bad_config_exits_2_with_the_offending_key(tmp_path: Path) -> None:
    config = tmp_path / "gpu.yml"
    config.write_text("interval: 5\nintervall: 3\n")
    proc = subprocess.run([EXPORTER, "--config", str(config), "--port", str(free_port())],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "intervall" in proc.stderr
    proc = subprocess.run([EXPORTER, "--interval", "0"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2


def test_bad_scenario_file_exits_2_with_the_offending_key(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"gpus": [{"temprature": 90}]}))
    proc = subprocess.run([EXPORTER, "--port", str(free_port())], capture_output=True,
                          text=True, timeout=60, env={**os.environ, ENV_FAKE_NVML: str(scenario)})
    assert proc.returncode == 2
    assert "temprature" in proc.stderr


def test_scenario_file_hang_power_limit_and_sigterm_while_hung(tmp_path: Path) -> None:
    """Other processes drive the simulated machine through the shared scenario file."""
    scenario = simulated_scenario(2, dynamic=False)
    path = tmp_path / "scenario.json"
    write_atomically(path, scenario)
    config = tmp_path / "gpu.yml"
    config.write_text("interval: 0.2\ndeadline: 0.5\nxid_events: false\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    argv = [EXPORTER, "--bind", "127.0.0.1", "--port", str(port), "--config", str(config)]
    with running(argv, tmp_path / "exporter.log", ready_url=url,
                 env={ENV_FAKE_NVML: str(path)}) as proc:
        wait_until(lambda: values(scrape(url), c.GPU_UP) == [1.0, 1.0], timeout=20,
                   what="both GPUs up")
        assert value(scrape(url), c.GPU_EXPORTER_SIMULATED) == 1

        tool = subprocess.run(
            [sys.executable, "-m",
             "trainwatch.exporters.node.tools.power_limit", "--gpu", "1", "--watts",
            "450"],
            env={**os.environ, ENV_FAKE_NVML: str(path)}, capture_output=True, text=True,
            timeout=60)
        assert tool.returncode == 0, tool.stderr
        wait_until(lambda: value(scrape(url), c.GPU_POWER_LIMIT, gpu="1") == 450, timeout=20,
                   what="exporter to see the new power limit")

        scenario = json.loads(path.read_text())
        scenario["hang"] = ["nvmlDeviceGetTemperature"]
        write_atomically(path, scenario)
        wait_until(lambda: value(scrape(url), c.GPU_EXPORTER_STALE) == 1, timeout=20, what="stale")
        series = scrape(url)
        assert value(series, c.GPU_POWER_LIMIT, gpu="1") == 450  # last complete snapshot
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.proc.wait(timeout=15) == 0, proc.log_text()


def test_no_driver_here_real_pynvml_keeps_serving_nvml_down_and_retries(tmp_path: Path) -> None:
    """Real pynvml on this GPU-less machine: nvmlInit fails (no libnvidia-ml)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    argv = [EXPORTER, "--bind", "127.0.0.1", "--port", str(port), "--interval", "0.1"]
    with running(argv, tmp_path / "exporter.log", ready_url=url, env={ENV_FAKE_NVML: ""}):
        series = wait_until(lambda: (s := scrape(url)) and values(s, c.GPU_EXPORTER_NVML_UP) and s,
                            timeout=20, what="first cycle")
        assert value(series, c.GPU_EXPORTER_NVML_UP) == 0
        assert value(series, c.GPU_EXPORTER_SIMULATED) == 0
        assert values(series, c.GPU_UP) == []
        first = sum(values(series, c.GPU_EXPORTER_ERRORS, call="nvmlInit"))
        assert first >= 1
        wait_until(lambda: sum(values(scrape(url), c.GPU_EXPORTER_ERRORS, call="nvmlInit")) > first,
                   timeout=20, what="an init retry after backoff")
