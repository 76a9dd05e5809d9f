"""Issue 11 item 6, against real remediation-server processes: /readyz fails when the store
cannot commit (full) or is damaged (a corrupt index page), and a store that was reset (0 bytes)
where one existed refuses to start without --accept-new-store, instead of acting again on an
alert it already acted on."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import requests

from tests.remediation.helpers import REPO, VENV_BIN, alert, auth, payload, stub_server
from tests.remediation.processes import service_config, start_service
from tests.support.net import free_port, wait_until
from tests.support.procs import running


def book(hostport: str) -> dict:
    return {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
            "target": ["training_job"],
            "steps": [{"action": "http", "url": f"http://{hostport}/act"}]}


def server_argv(config: Path, port: int, *extra: str) -> list[str]:
    return [str(VENV_BIN / "remediation-server"), "--config", str(config), "--port", str(port),
            *extra]


def test_a_reset_store_refuses_to_start_without_the_operator_flag(tmp_path: Path) -> None:
    with stub_server() as (hostport, state):
        port = free_port()
        config = service_config(tmp_path, [book(hostport)], port=port)
        fired = payload(alert("TrainingLossSpike", {"training_job": "j"}, fingerprint="abc1"))
        with start_service(config, port, "first.log") as svc:
            assert svc.post(fired).json()["accepted"] == 1
            wait_until(lambda: svc.actions(decision="acted")["audit"], timeout=30,
                       what="the action")
        store = tmp_path / "remediation.sqlite"
        store.write_bytes(b"")  # truncated to 0 bytes
        for suffix in ("-wal", "-shm"):
            Path(f"{store}{suffix}").unlink(missing_ok=True)
        refused = subprocess.run(server_argv(config, port), capture_output=True, text=True,
                                 timeout=30, check=False, cwd=REPO)
        assert refused.returncode == 2
        assert "is empty" in refused.stderr and "--accept-new-store" in refused.stderr
        store.unlink()
        missing = subprocess.run(server_argv(config, port), capture_output=True, text=True,
                                 timeout=30, check=False, cwd=REPO)
        assert missing.returncode == 2 and "is missing" in missing.stderr
        assert len(state.posts("/act")) == 1
        with running(server_argv(config, port, "--accept-new-store"), tmp_path / "new.log",
                     ready_url=f"http://127.0.0.1:{port}/readyz", cwd=REPO):
            pass
        with start_service(config, port, "again.log"):  # the marker now names the new store
            pass


def test_readyz_fails_when_the_store_is_full(tmp_path: Path) -> None:
    port = free_port()
    config = service_config(tmp_path, [book("127.0.0.1:1")], port=port,
                            store_max_bytes=262144, dry_run=True)
    with start_service(config, port) as svc:
        code, n = 200, 0
        while code == 200 and n < 2000:
            n += 1
            code = svc.post(payload(*[alert("TrainingLossSpike", {
                "training_job": f"j{n}", "pad": "p" * 3000}) for _ in range(4)])).status_code
        assert code == 503  # nothing could be recorded: Alertmanager retries
        ready = requests.get(f"{svc.url}/readyz", timeout=10)
        assert ready.status_code == 503, ready.text
        assert any("commit" in p for p in ready.json()["problems"])


def test_readyz_fails_on_a_corrupt_index_page(tmp_path: Path) -> None:
    port = free_port()
    config = service_config(tmp_path, [book("127.0.0.1:1")], port=port, dry_run=True)
    with start_service(config, port, "first.log") as svc:
        for n in range(40):
            svc.post(payload(*[alert("TrainingLossSpike", {"training_job": f"j{n}"})
                               for _ in range(10)]))
    store = tmp_path / "remediation.sqlite"
    with sqlite3.connect(store) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name='intents_claim'"
                            ).fetchone()[0]
    with open(store, "r+b") as fh:  # overwrite the index's root page with garbage
        fh.seek((root - 1) * page_size)
        fh.write(b"\x0d\xff" * (page_size // 2))
    url = f"http://127.0.0.1:{port}"
    with running(server_argv(config, port), tmp_path / "second.log", cwd=REPO):
        (ready,) = wait_until(lambda: (requests.get(f"{url}/readyz", timeout=5),),
                              timeout=30, what="readyz answering")
        assert ready.status_code == 503, ready.text
        assert any("damaged" in p for p in ready.json()["problems"]), ready.json()


def test_a_store_file_deleted_or_replaced_under_the_service_stops_intake(
        tmp_path: Path) -> None:
    """Issue 25 item 9: SQLite goes on writing to an unlinked file and answers every commit as
    durable. Deleted (then replaced by another file) under a running service, the store stops
    accepting: 503 for new alerts, /readyz fails saying why, no empty store is created at the
    path; after a restart the missing store is refused with what to do, and
    --accept-new-store starts a fresh one that accepts again."""
    with stub_server() as (hostport, state):
        port = free_port()
        config = service_config(tmp_path, [book(hostport)], port=port)
        store = tmp_path / "remediation.sqlite"
        url = f"http://127.0.0.1:{port}"
        with start_service(config, port, "first.log") as svc:
            first = payload(alert("TrainingLossSpike", {"training_job": "a"}, fingerprint="a1"))
            assert svc.post(first).json()["accepted"] == 1
            wait_until(lambda: svc.actions(decision="acted")["audit"], timeout=30,
                       what="the first action")
            store.unlink()
            lost = svc.post(payload(alert("TrainingLossSpike", {"training_job": "b"},
                                          fingerprint="b1")))
            assert lost.status_code == 503, lost.text
            assert "deleted" in lost.text
            ready = requests.get(f"{url}/readyz", timeout=10)
            assert ready.status_code == 503 and "deleted" in ready.text, ready.text
            assert not store.exists()  # no empty store made by another thread's connection
            store.write_bytes(b"")  # another file at the path: still not the store it opened
            replaced = svc.post(payload(alert("TrainingLossSpike", {"training_job": "c"},
                                              fingerprint="c1")))
            assert replaced.status_code == 503 and "replaced" in replaced.text, replaced.text
            store.unlink()
        assert len(state.posts("/act")) == 1  # nothing answered 503 acted
        refused = subprocess.run(server_argv(config, port), capture_output=True, text=True,
                                 timeout=30, check=False, cwd=REPO)
        assert refused.returncode == 2, refused.stderr
        assert "is missing" in refused.stderr and "--accept-new-store" in refused.stderr
        with running(server_argv(config, port, "--accept-new-store"), tmp_path / "new.log",
                     ready_url=f"{url}/readyz", cwd=REPO):
            again = requests.post(f"{url}/v1/alerts", headers=auth(), timeout=10, json=payload(
                alert("TrainingLossSpike", {"training_job": "d"}, fingerprint="d1")))
            assert again.status_code == 200 and again.json()["accepted"] == 1, again.text
