"""exporters/contract/serving.py with TLS: HTTPS that clients verify against the deploy's CA,
nothing else on the port, and a slow or silent TLS client holds no handler thread."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.tls import Authority
from trainwatch.exporters.contract import serving


def _hello(environ: dict, start_response) -> list[bytes]:  # type: ignore[no-untyped-def]
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok:" + body]


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Authority]]:
    ca = Authority(tmp_path / "pki")
    issued = ca.issue("service")
    server = serving.make_server(_hello, "127.0.0.1", 0, limits=serving.Limits(threads=1),
                                 tls=serving.Tls(str(issued.cert), str(issued.key)))
    http = serving.Background(server)
    try:
        yield f"127.0.0.1:{server.port}", ca
    finally:
        http.stop()


def test_a_client_that_verifies_the_ca_is_served(tls_server: tuple[str, Authority]) -> None:
    address, ca = tls_server
    big = b"x" * 200_000  # several TLS records each way
    response = requests.post(f"https://{address}/", data=big, verify=str(ca.ca_file),
                             timeout=10)
    assert response.status_code == 200 and response.content == b"ok:" + big


def test_plain_http_and_clients_that_do_not_trust_the_ca_are_refused(
        tls_server: tuple[str, Authority], tmp_path: Path) -> None:
    address, _ca = tls_server
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{address}/", timeout=10)
    other = Authority(tmp_path / "other", name="someone else's CA")
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"https://{address}/", verify=str(other.ca_file), timeout=10)
    with pytest.raises(requests.exceptions.SSLError):  # the system's CAs do not know it either
        requests.get(f"https://{address}/", timeout=10)


def test_the_remediation_services_session_keeps_its_ca_whatever_the_environment_says(
        tls_server: tuple[str, Authority], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: the cluster's loss spike was never cut because the remediation service ran
    with REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE set (this machine sets both), which requests lets
    replace a session's `verify`: every control API call failed certificate verification, so
    scale_lr never reached an exporter. The engine's session (control_api_session) keeps the
    configured CA; a plain session shows the trap."""
    from trainwatch.remediation.engine import control_api_session

    address, ca = tls_server
    other = Authority(tmp_path / "other", name="the environment's CA")
    for variable in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.setenv(variable, str(other.ca_file))
    plain = requests.Session()
    plain.verify = str(ca.ca_file)
    with pytest.raises(requests.exceptions.SSLError):  # the environment won
        plain.get(f"https://{address}/", timeout=10)
    session = control_api_session(ca.ca_file)
    response = session.post(f"https://{address}/", data=b"cut", timeout=10)
    assert response.status_code == 200 and response.content == b"ok:cut"
    # without a CA configured the session is requests' own: the environment's bundle decides
    with pytest.raises(requests.exceptions.SSLError):
        control_api_session(None).get(f"https://{address}/", timeout=10)


def test_a_silent_tls_client_holds_no_handler_thread(tls_server: tuple[str, Authority]) -> None:
    """With one handler thread, clients that connect and never finish the handshake (or send
    half a request over TLS) must not stop a verified client from being served."""
    address, ca = tls_server
    host, port = address.split(":")
    silent = [socket.create_connection((host, int(port)), timeout=5) for _ in range(4)]
    context = ssl.create_default_context(cafile=str(ca.ca_file))
    half = context.wrap_socket(socket.create_connection((host, int(port)), timeout=5),
                               server_hostname="127.0.0.1")
    half.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
    try:
        response = requests.get(f"https://{address}/", verify=str(ca.ca_file), timeout=10)
        assert response.status_code == 200
    finally:
        half.close()
        for conn in silent:
            conn.close()


def test_the_training_exporter_serves_its_control_api_over_verified_tls(tmp_path: Path) -> None:
    """--tls-cert/--tls-key: the control API (it carries the remediation token) and /metrics
    answer over HTTPS to a client that verifies the CA; plain HTTP gets no answer."""
    from tests.support.net import free_port, wait_until
    from tests.support.procs import running
    from tests.training.support import EXPORTER, write_token

    ca = Authority(tmp_path / "pki")
    issued = ca.issue("node-a")
    token, token_file = write_token(tmp_path)
    port = free_port()
    argv = [str(EXPORTER), "--bind", "127.0.0.1", "--port", str(port),
            "--socket", str(tmp_path / "node.sock"), "--token-file", str(token_file),
            "--tls-cert", str(issued.cert), "--tls-key", str(issued.key)]
    base = f"https://127.0.0.1:{port}"
    with running(argv, tmp_path / "exporter.log"):
        wait_until(lambda: requests.get(f"{base}/metrics", verify=str(ca.ca_file),
                                        timeout=5).status_code == 200,
                   timeout=30, what="exporter over TLS")
        jobs = requests.get(f"{base}/v1/jobs", verify=str(ca.ca_file), timeout=5,
                            headers={"Authorization": f"Bearer {token}"})
        assert jobs.status_code == 200 and jobs.json() == {"jobs": []}
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/v1/jobs", timeout=5,
                         headers={"Authorization": f"Bearer {token}"})
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"{base}/metrics", timeout=5)
