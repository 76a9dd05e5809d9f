"""A shared node: two Unix users' jobs report to one training exporter, and the second user's
process tries to act for the first job. Each try is refused and counted; the first job keeps
only its own ranks, its own losses and its own commands (docs/training.md, "Shared nodes").

Needs root (throwaway users are created and removed with useradd/userdel).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.net import free_port, wait_until
from tests.support.procs import running
from tests.training.support import JOB_BASE_ENV, events, exporter, of, write_token
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract.wire import VERSION, encode

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "jobs" / "worker.py"
INTRUDER = Path(__file__).parent / "jobs" / "intruder.py"
REFUSED = catalog.TRAINING_EXPORTER_REFUSED
VICTIM, OTHER = "shared-victim", "shared-other"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("setpriv") is None,
    reason="needs root, useradd and setpriv to run two jobs as two throwaway users")]


class Users:
    """Two throwaway users in one throwaway group (the node's training group)."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.group = f"twg{tag}"
        self.names = (f"twa{tag}", f"twb{tag}")
        subprocess.run(["groupadd", self.group], check=True)
        for name in self.names:
            subprocess.run(["useradd", "-M", "-N", "-g", self.group, "-s", "/usr/sbin/nologin",
                            name], check=True)

    def uid(self, name: str) -> int:
        return int(subprocess.run(["id", "-u", name], check=True, capture_output=True,
                                  text=True).stdout)

    def gid(self) -> int:
        return int(subprocess.run(["getent", "group", self.group], check=True,
                                  capture_output=True, text=True).stdout.split(":")[2])

    def argv(self, name: str, *command: str) -> list[str]:
        return ["setpriv", f"--reuid={name}", f"--regid={self.group}", "--init-groups",
                *command]

    def remove(self) -> None:
        for name in self.names:
            subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", self.group], check=False, capture_output=True)


@pytest.fixture
def users() -> Iterator[Users]:
    made = Users()
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder both users can reach (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="tw-shared-node-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _open_to_others(path: Path) -> bool:
    """Whether another user may run the file (every folder above it is searchable)."""
    path = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in path.parents) and bool(path.stat().st_mode & 1)


def python_for_others(shared_dir: Path) -> tuple[str, dict[str, str]]:
    """An interpreter another user can run with this test's packages, and its environment:
    this one where its path is open to others, else the system's of the same version with
    this one's site-packages on PYTHONPATH (a pyenv under /root is not). The system's does not
    run the editable install's finder (a .pth file, read only in site folders), so
    `trainwatch` comes from a namespace folder in `shared_dir` linking to this checkout's
    exporters/ and remediation/ (the code under test, as the exporter runs it)."""
    if _open_to_others(Path(sys.executable)):
        return sys.executable, {}
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists() or not _open_to_others(system):
        pytest.skip("no Python interpreter another user may run")
    namespace = shared_dir / "namespace" / "trainwatch"
    namespace.mkdir(parents=True)
    for folder in ("exporters", "remediation"):
        (namespace / folder).symlink_to(REPO / folder, target_is_directory=True)
    sites = [p for p in sys.path if p.endswith("site-packages")]
    return str(system), {"PYTHONPATH": os.pathsep.join([str(namespace.parent), str(REPO),
                                                        *sites])}


def _refused(exp: object, channel: str) -> float:
    return sum(v for k, v in exp.samples(REFUSED).items()  # type: ignore[attr-defined]
               if dict(k).get("channel") == channel)


def test_another_users_process_cannot_report_read_or_command_for_a_job(
        tmp_path: Path, users: Users, shared_dir: Path) -> None:
    victim_user, intruder_user = users.names
    home = shared_dir / "home"
    home.mkdir()
    os.chown(home, users.uid(victim_user), users.gid())
    token = write_token(shared_dir)  # 0600 root: the services' own, as the deploy writes it
    socket_path = shared_dir / "node.sock"
    with exporter(tmp_path, socket=socket_path, token=token) as exp:
        for path in (socket_path, Path(catalog.command_socket(str(socket_path)))):
            os.chown(path, -1, users.gid())  # the node's training group reaches the sockets
        python, python_env = python_for_others(shared_dir)
        env = {**JOB_BASE_ENV, **python_env, "HOME": str(home), "TMPDIR": str(home),
               catalog.ENV_JOB: VICTIM, catalog.ENV_EXPORTER_SOCKET: str(socket_path)}
        job_argv = users.argv(victim_user, python, "-m", "torch.distributed.run",
                              "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                              "--master-port", str(free_port()), str(WORKER), "--steps", "0")
        with running(job_argv, tmp_path / "victim.log", env=env) as job:
            wait_until(lambda: set(exp.by_rank("training_step", VICTIM)) == {"0", "1"},
                       timeout=120, what="the victim job's two ranks on the exporter")
            incarnation = exp.api("GET", "/v1/jobs").json()["jobs"][0]["incarnation"]
            replay = shared_dir / "captured.bin"  # a datagram as the victim's rank 0 sends it
            replay.write_bytes(encode({
                "v": VERSION, "job": VICTIM, "rank": 0, "local_rank": 0, "world_size": 2,
                "restarts": 0, "incarnation": incarnation,
                "steps": [[10**6, time.time(), 0.01, float("nan"), 9.0, None, None]]}))
            replay.chmod(0o644)

            done = subprocess.run(
                users.argv(intruder_user, python, str(INTRUDER),
                           "--socket", str(socket_path), "--url", exp.url,
                           "--victim", VICTIM, "--own-job", OTHER, "--replay", str(replay),
                           "--token-file", str(token[1])),
                capture_output=True, text=True, timeout=60,
                env={**os.environ, **python_env, "HOME": str(shared_dir)})
            assert done.returncode == 0, done.stderr
            seen = {e["attempt"]: e for e in map(json.loads, done.stdout.splitlines())}

            # The victim's remediation still reaches it: a command posted with the
            # service's token is applied by both ranks over the command socket.
            posted = exp.api("POST", f"/v1/jobs/{VICTIM}/commands",
                             json={"type": "mark", "args": {}})
            assert posted.status_code == 202, posted.text
            command_id = posted.json()["id"]
            wait_until(lambda: exp.api("GET", f"/v1/jobs/{VICTIM}/commands/{command_id}")
                       .json()["status"] == "applied", timeout=60, what="mark applied")

            # Each try was refused, as the intruder saw it and as the exporter counts it.
            assert seen["poll_victim"]["answer"]["status"] == 403
            assert seen["poll_own"]["answer"] == {"commands": []}
            assert seen["read_token"]["readable"] is False
            assert seen["post_rollback"]["status"] == 401
            wait_until(lambda: _refused(exp, "report") >= 3, timeout=10,
                       what="three refused datagrams (NaN, extra rank, replay)")
            assert _refused(exp, "commands") == 1
            assert _refused(exp, "control_api") == 1
            # The victim: only its own ranks, never a non-finite loss, never rolled back.
            assert set(exp.by_rank("training_step", VICTIM)) == {"0", "1"}
            assert all(v < 10**6 for v in exp.by_rank("training_step", VICTIM).values())
            assert exp.by_rank("training_nonfinite_loss_total", VICTIM) == {}  # none, ever
            assert set(exp.by_rank("training_rollbacks_total", VICTIM).values()) <= {0}
            listed = exp.api("GET", f"/v1/jobs/{VICTIM}/commands").json()["commands"]
            assert [c["type"] for c in listed] == ["mark"]
            assert not of(events(job), "applied", type="rollback")
            # The intruder's own job is served as usual.
            assert set(exp.by_rank("training_step", OTHER)) == {"0"}
        # Logged once per sender and job, though it sent three datagrams for the victim.
        pid = seen["own_report"]["pid"]
        lines = [line for line in exp.proc.log_text().splitlines()
                 if f"refused datagrams of pid {pid} " in line]
        assert len(lines) == 1 and repr(VICTIM) in lines[0], lines
