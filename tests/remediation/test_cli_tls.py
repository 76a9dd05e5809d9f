"""The `trainwatch` CLI against a remediation service that serves TLS (issue 39): it verifies
the service against `ca_file` (the deploy's CA), whatever REQUESTS_CA_BUNDLE says, and a service
it cannot verify is an error, not a silent fallback.

Before: the CLI had no CA setting (an unknown key in its config) and the role wrote an http://
URL for it, which a service with TLS does not answer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.remediation.helpers import TOKEN, VENV_BIN
from tests.remediation.processes import service_config
from tests.support.net import Abort, free_port, wait_until
from tests.support.procs import answers, running
from tests.support.tls import Authority

CLI = [sys.executable, "-m", "trainwatch.remediation.operator"]


def test_the_cli_verifies_the_service_against_its_ca_file(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "pki")
    issued = ca.issue("remediation")
    other = Authority(tmp_path / "other", name="someone else's CA")
    port = free_port()
    book = {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
            "target": ["training_job"], "steps": [{"action": "http", "url": "http://127.0.0.1:1/"}]}
    config = service_config(tmp_path / "service", [book], port=port,
                            tls_cert_file=str(issued.cert), tls_key_file=str(issued.key),
                            tls_ca_file=str(ca.ca_file))
    url = f"https://127.0.0.1:{port}"
    token_file = tmp_path / "cli.token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    argv = [str(VENV_BIN / "remediation-server"), "--config", str(config), "--port", str(port)]
    with running(argv, tmp_path / "remediation.log", env={"PYTHONUNBUFFERED": "1"}) as proc:
        def ready() -> bool:
            if not proc.alive():
                raise Abort(f"the service exited:\n{proc.log_text()[-2000:]}")
            return answers(f"{url}/readyz", verify=str(ca.ca_file))

        wait_until(ready, timeout=60, what="the service over TLS")
        # the environment points requests at another CA: the CLI's ca_file must still win
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
               "REQUESTS_CA_BUNDLE": str(other.ca_file), "CURL_CA_BUNDLE": str(other.ca_file),
               "TRAINWATCH_REMEDIATION_URL": url, "TRAINWATCH_TOKEN_FILE": str(token_file)}
        listed = cli(["actions"], {**env, "TRAINWATCH_CA_FILE": str(ca.ca_file)})
        assert listed.returncode == 0, listed.stderr
        assert '"actions": []' in listed.stdout

        unverified = cli(["actions"], env)  # no ca_file: the environment's CA does not know it
        assert unverified.returncode == 1
        assert "SSLError" in unverified.stderr, unverified.stderr

        missing = cli(["actions"], {**env, "TRAINWATCH_CA_FILE": str(tmp_path / "absent.pem")})
        assert missing.returncode == 2 and "ca_file" in missing.stderr, missing.stderr


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=60,
                          check=False)


@pytest.mark.parametrize("value", ["", None])
def test_without_a_ca_file_the_system_cas_are_used(value: str | None) -> None:
    from trainwatch.remediation.operator import Settings

    values = {} if value is None else {"ca_file": value}
    assert Settings(values).verify() is True
