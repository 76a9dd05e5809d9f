"""Start real binaries for tests and make sure every one of them is stopped again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import requests

from tests.support.net import Abort, free_port, wait_until


class ManagedProcess:
    """A child process in its own session, with output captured to a log file.

    Stopping kills the whole process group, so helpers a server spawns die with it.
    """

    def __init__(self, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        self._log.close()
        return self.proc.returncode

    def kill9(self) -> None:
        """SIGKILL the process group: a crash, not a shutdown."""
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def answers(url: str, timeout: float = 2.0, verify: str | bool = True) -> bool:
    """Whether `url` answers 200 now (False while it refuses, times out or fails its TLS
    check against `verify`, a CA file): what a readiness poll under wait_until asks."""
    try:
        return requests.get(url, timeout=timeout, verify=verify).status_code == 200
    except requests.RequestException:
        return False


@contextmanager
def running(argv: Sequence[str], log_path: Path, ready_url: str | None = None,
            timeout: float = 30.0, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> Iterator[ManagedProcess]:
    """Run `argv` until the block ends; wait for `ready_url` to answer 200 first."""
    proc = ManagedProcess(argv, log_path, env=env, cwd=cwd)
    try:
        if ready_url:
            def check() -> bool:
                if not proc.alive():
                    raise Abort(f"{argv[0]} exited early:\n{proc.log_text()[-3000:]}")
                return answers(ready_url, timeout=1.0)

            try:
                wait_until(check, timeout=timeout, what=f"{argv[0]} at {ready_url}")
            except TimeoutError as exc:
                raise TimeoutError(f"{exc}\n--- log ---\n{proc.log_text()[-3000:]}") from exc
        yield proc
    finally:
        proc.stop()


@contextmanager
def prometheus(workdir: Path, config_path: Path, *, port: int | None = None,
               extra_args: Sequence[str] = (), address: str = "127.0.0.1") -> Iterator[str]:
    """Real Prometheus on a free port (of `address`); yields its base URL.

    The rule resend delay is lowered because a test stack that starts Prometheus and
    Alertmanager together otherwise waits up to a minute for the first notification.
    """
    port = port or free_port()
    data = workdir / f"prom-data-{port}"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        "prometheus",
        f"--config.file={config_path}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address={address}:{port}",
        "--web.enable-lifecycle",
        "--rules.alert.resend-delay=1s",
        "--log.level=warn",
        *extra_args,
    ]
    url = f"http://{address}:{port}"
    with running(argv, workdir / f"prometheus-{port}.log", ready_url=f"{url}/-/ready"):
        yield url


@contextmanager
def alertmanager(workdir: Path, config_path: Path, *, port: int | None = None,
                 extra_args: Sequence[str] = (),
                 basic_auth: tuple[str, str] | None = None,
                 address: str = "127.0.0.1") -> Iterator[str]:
    """Real Alertmanager (Debian's prometheus-alertmanager) on a free port (of `address`), no
    clustering;
    with `basic_auth` (user, password) its API requires that credential (a web config with
    the password's bcrypt hash, as the alertmanager role writes it)."""
    port = port or free_port()
    data = workdir / f"am-data-{port}"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        "prometheus-alertmanager",
        f"--config.file={config_path}",
        f"--storage.path={data}",
        f"--web.listen-address={address}:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
        *extra_args,
    ]
    url = f"http://{address}:{port}"
    ready = f"{url}/-/ready"
    if basic_auth is not None:
        import bcrypt

        user, password = basic_auth
        web = workdir / f"am-web-{port}.yml"
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        web.write_text(json.dumps({"basic_auth_users": {user: hashed}}))
        argv.append(f"--web.config.file={web}")
        ready = f"http://{user}:{password}@{address}:{port}/-/ready"
    with running(argv, workdir / f"alertmanager-{port}.log", ready_url=ready):
        yield url
