"""Run real `remediation-server` processes (gunicorn) for tests that need crashes and pairs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from tests.remediation.helpers import REPO, VENV_BIN, auth, write_config, write_playbook
from tests.support.net import free_port
from tests.support.procs import ManagedProcess, running


@dataclass
class RunningService:
    url: str
    proc: ManagedProcess
    config_path: Path

    def post(self, body: Any) -> requests.Response:
        return requests.post(f"{self.url}/v1/alerts", json=body, headers=auth(), timeout=10)

    def actions(self, **params: Any) -> dict[str, Any]:
        resp = requests.get(f"{self.url}/v1/actions", params={"limit": 1000, **params},
                            headers=auth(), timeout=10)
        resp.raise_for_status()
        return resp.json()


def service_config(workdir: Path, playbooks: list[dict[str, Any]] | None,
                   **overrides: Any) -> Path:
    if playbooks is not None:
        for doc in playbooks:
            write_playbook(workdir / "playbooks", doc)
        overrides.setdefault("playbooks_dir", str(workdir / "playbooks"))
    overrides.setdefault("port", free_port())
    return write_config(workdir, **overrides)


@contextmanager
def start_service(config_path: Path, port: int, log_name: str = "remediation.log"
                  ) -> Iterator[RunningService]:
    url = f"http://127.0.0.1:{port}"
    argv = [str(VENV_BIN / "remediation-server"), "--config", str(config_path),
            "--port", str(port)]
    with running(argv, config_path.parent / log_name, ready_url=f"{url}/readyz",
                 env={"PYTHONUNBUFFERED": "1"}, cwd=REPO) as proc:
        yield RunningService(url, proc, config_path)


@contextmanager
def running_service(workdir: Path, playbooks: list[dict[str, Any]] | None = None,
                    **overrides: Any) -> Iterator[RunningService]:
    port = free_port()
    config = service_config(workdir, playbooks, port=port, **overrides)
    with start_service(config, port) as svc:
        yield svc
