"""The victoriametrics role converges on this machine (the dedicated supervisord, no systemd
here), a second run changes nothing, the store answers and accepts a remote-written sample
from a real Prometheus, and stop.yml leaves no process behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import yaml

from tests.ansible.runner import STOP, run_playbook
from tests.ansible.test_local_deploy import processes_under
from tests.support.net import free_port, wait_until
from tests.support.procs import prometheus

pytestmark = pytest.mark.slow
PLAYBOOK = Path(__file__).with_name("victoriametrics.yml")


def test_victoriametrics_role_converges_and_receives_remote_write(
        real_binaries: dict[str, str], tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    port = free_port()
    extra = {"trainwatch_prefix": str(prefix), "victoriametrics_port": port,
             "victoriametrics_bind_address": "127.0.0.1", "trainwatch_venv_enabled": False}
    try:
        first = run_playbook(PLAYBOOK, extra, tmp_path)
        assert first.rc == 0 and first.total("failed") == 0, first.describe()
        assert first.total("changed") > 0
        second = run_playbook(PLAYBOOK, extra, tmp_path)
        assert second.rc == 0 and second.total("changed") == 0, second.describe()
        vm = f"http://127.0.0.1:{port}"
        wait_until(lambda: requests.get(f"{vm}/health", timeout=2).status_code == 200,
                   timeout=60, what="VictoriaMetrics /health")
        assert any("-retentionPeriod=12" in p for p in processes_under(prefix))
        assert (prefix / "data" / "victoriametrics").is_dir()
        # a real Prometheus remote-writes its own `up` series there
        config = tmp_path / "prometheus.yml"
        prom_port = free_port()
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "self", "static_configs": [
                {"targets": [f"127.0.0.1:{prom_port}"]}]}],
            "remote_write": [{"url": f"{vm}/api/v1/write",
                              "queue_config": {"batch_send_deadline": "1s"}}]}))
        with prometheus(tmp_path, config, port=prom_port):
            def stored() -> bool:
                body = requests.get(f"{vm}/api/v1/query", params={"query": 'up{job="self"}'},
                                    timeout=5).json()
                return bool(body["data"]["result"])
            wait_until(stored, timeout=60, interval=1, what="a remote-written sample")
    finally:
        stop = run_playbook(STOP, extra, tmp_path)
        assert stop.rc == 0, stop.describe()
        wait_until(lambda: not processes_under(prefix), timeout=30,
                   what="every process under the prefix to exit")
