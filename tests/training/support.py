"""Helpers for the training tests: a real training-exporter process and real torchrun jobs."""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.net import free_port, wait_until
from tests.support.procs import ManagedProcess, running

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"
EXPORTER = Path(sys.executable).parent / "training-exporter"


@dataclass
class Exporter:
    url: str
    socket: Path
    token: str
    token_file: Path
    proc: ManagedProcess
    argv: list[str] = field(default_factory=list)

    def restart(self) -> None:
        """Stop the exporter (its memory is lost) and start it again with the same arguments
        (port, socket, token, command log), as its supervisor would."""
        self.proc.stop()
        self.proc = ManagedProcess(self.argv, self.proc.log_path)
        wait_until(lambda: _answers(self.url + "/metrics"), timeout=30,
                   what="exporter back after restart")
        wait_until(self.socket.exists, timeout=10, what="exporter socket after restart")

    def api(self, method: str, path: str, token: str | bool | None = True,
            **kwargs: Any) -> requests.Response:
        """Call the control API; `token=True` uses the right token, None sends none."""
        headers = kwargs.pop("headers", {})
        token = self.token if token is True else token
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return requests.request(method, self.url + path, headers=headers, timeout=5, **kwargs)

    def samples(self, name: str, job: str | None = None
                ) -> dict[tuple[tuple[str, str], ...], float]:
        """Sample values of one metric (by sample name), keyed by sorted label pairs."""
        text = requests.get(self.url + "/metrics", timeout=5).text
        found = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and job in (None, sample.labels.get("training_job")):
                    found[tuple(sorted(sample.labels.items()))] = sample.value
        return found

    def by_rank(self, name: str, job: str) -> dict[str, float]:
        return {dict(k)["rank"]: v for k, v in self.samples(name, job).items()}

    def job_env(self, job: str) -> dict[str, str]:
        return {"TRAINWATCH_JOB": job, "TRAINWATCH_EXPORTER_SOCKET": str(self.socket)}


def write_token(directory: Path, name: str = "control.token") -> tuple[str, Path]:
    token = secrets.token_hex(16)
    path = directory / name
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token, path


@contextmanager
def exporter(workdir: Path, name: str = "exporter", *, node: str = "node-a",
             socket: Path | None = None, port: int | None = None,
             token: tuple[str, Path] | None = None, extra: tuple[str, ...] = ()
             ) -> Iterator[Exporter]:
    """A real `training-exporter` on a free port; stopped (SIGTERM) when the block ends."""
    port = port or free_port()
    token_value, token_file = token or write_token(workdir, f"{name}.token")
    socket = socket or workdir / f"{name}.sock"
    argv = [str(EXPORTER), "--bind", "127.0.0.1", "--port", str(port), "--socket", str(socket),
            "--token-file", str(token_file), "--node", node, *extra]
    url = f"http://127.0.0.1:{port}"
    with running(argv, workdir / f"{name}.log", ready_url=f"{url}/metrics") as proc:
        wait_until(socket.exists, timeout=10, what="exporter socket")
        exp = Exporter(url, socket, token_value, token_file, proc, argv)
        try:
            yield exp
        finally:
            exp.proc.stop()  # the process restart() started, if any


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def events_in(text: str) -> list[dict[str, Any]]:
    """The JSON event lines of an example's output (other output is skipped)."""
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def events(proc: ManagedProcess) -> list[dict[str, Any]]:
    """The JSON event lines the example printed so far."""
    return events_in(proc.log_text())


def of(found: list[dict[str, Any]], event: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in found if e.get("event") == event
            and all(e.get(k) == v for k, v in match.items())]


def torchrun(*args: str, nproc: int = 2, nnodes: int = 1, node_rank: int = 0,
             master_port: int) -> list[str]:
    """A real torchrun launch of the example on loopback (static rendezvous)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--master-addr", "127.0.0.1", "--master-port", str(master_port),
            str(EXAMPLE), *args]


JOB_BASE_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def elastic_torchrun(script: Path, *args: str, nproc: int = 2, max_restarts: int) -> list[str]:
    """torchrun that restarts the worker group in place up to `max_restarts` times, on one
    node (run with ELASTIC_ENV).

    The c10d rendezvous with its store not shared (ELASTIC_ENV) gives every restart round a
    fresh TCP store for the workers. With the static rendezvous (--master-addr/--master-port)
    or a shared store, all rounds use one store with the same keys, so the restarted ranks
    can read the gloo addresses the dead attempt published and hang in init_process_group
    (gloo connectFullMesh) until 'Connection refused' ends the attempt.
    """
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--max-restarts", str(max_restarts), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(script), *args]


ELASTIC_ENV = {**JOB_BASE_ENV, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
