"""Issue 11 items 1 and 9c: a host action runs only on the one inventory host its `node` label
names exactly, and Ansible's children never inherit the service's secrets.

Real parts: remediation-server (gunicorn) over HTTP, ansible-runner running ansible-playbook
against a local inventory of four hosts (ansible_connection=local, a marker file per host
shows where a play ran), Ansible's own InventoryManager. On the code before the fix,
`node="all"` ran the play on every host (and `gpu`, `node-a:node-b` on several), and the
play's environment held the tokens the service was started with.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.remediation.helpers import (
    CONTROL_TOKEN,
    REPO,
    TOKEN,
    VENV_BIN,
    alert,
    auth,
    payload,
    write_config,
    write_playbook,
)
from tests.remediation.host_inventory import (
    HOSTS,
    REMEDIATION_PLAYBOOK,
    marked,
    write_inventory,
    write_mark_playbook,
)
from tests.support.alertmanager_config import render_one
from tests.support.net import free_port, wait_until
from tests.support.procs import alertmanager, running
from trainwatch.remediation.inventory import TargetError, resolve_hosts

# Every host-pattern form Ansible knows, plus names that are not (only) one inventory host.
PATTERNS = [
    "all", "*", "gpu", "ungrouped", "gpu-x", "node-a:node-b", "node-a,node-b", "node-a;node-b",
    "gpu:&node-a", "node-a:!node-b", "!node-c", "~node-.*", "node-[a:b]", "node-*", "node-?",
    "@/etc/hostname", "localhost", "127.0.0.1", "node-d", "NODE-A", " node-a", "node-a ", "",
]
TERMINAL = ("refused", "acted", "failed", "cooled_down")


@pytest.fixture()
def inventory(tmp_path: Path) -> Path:
    return write_inventory(tmp_path / "inventory.yml", tmp_path / "markers")


@pytest.mark.parametrize("value", PATTERNS)
def test_resolve_refuses_patterns_and_non_hosts(inventory: Path, value: str) -> None:
    with pytest.raises(TargetError):
        resolve_hosts(inventory, [value], inventory.parent / "state")


def test_resolve_accepts_exact_hosts_only(inventory: Path) -> None:
    state = inventory.parent / "state"
    assert resolve_hosts(inventory, ["node-b"], state) == ["node-b"]
    assert resolve_hosts(inventory, ["node-c", "node-a"], state) == ["node-c", "node-a"]
    with pytest.raises(TargetError, match="no ansible_inventory"):
        resolve_hosts(None, ["node-a"], state)


@pytest.fixture()
def service(tmp_path: Path, inventory: Path) -> Iterator[tuple[str, Path]]:
    """remediation-server with the mark playbook, started the way compose did: with the tokens
    in its environment too."""
    port = free_port()
    env = {"REMEDIATION_WEBHOOK_TOKEN": TOKEN, "TRAINING_CONTROL_TOKEN": CONTROL_TOKEN}
    with _start_service(tmp_path, inventory, REMEDIATION_PLAYBOOK, port, env):
        yield f"http://127.0.0.1:{port}", tmp_path / "markers"


def _start_service(tmp_path: Path, inventory: Path, book: dict, port: int,
                   env: dict[str, str]):  # -> running() context manager
    ansible_dir = tmp_path / "ansible"
    write_mark_playbook(ansible_dir)
    write_playbook(tmp_path / "playbooks", book)
    config = write_config(tmp_path, port=port, playbooks_dir=str(tmp_path / "playbooks"),
                          ansible_playbooks_dir=str(ansible_dir),
                          ansible_inventory=str(inventory), max_attempts=3)
    argv = [str(VENV_BIN / "remediation-server"), "--config", str(config)]
    return running(argv, tmp_path / "service.log",
                   ready_url=f"http://127.0.0.1:{port}/readyz",
                   env={"PYTHONUNBUFFERED": "1", **env}, cwd=REPO)


def _audit(url: str) -> list[dict]:
    resp = requests.get(f"{url}/v1/actions", params={"limit": 5000}, headers=auth(), timeout=10)
    resp.raise_for_status()
    return resp.json()["audit"]


def _decisions(url: str, fingerprint: str) -> list[str]:
    return [r["decision"] for r in _audit(url) if r["fingerprint"] == fingerprint]


def test_only_the_named_host_is_acted_on(service: tuple[str, Path]) -> None:
    url, markers = service
    bad = [alert("HostMark", {"node": value}, fingerprint=f"{i:016x}")
           for i, value in enumerate(PATTERNS)]
    for one in bad:  # one notification each: no alert's fate depends on a neighbour's
        resp = requests.post(f"{url}/v1/alerts", json=payload(one), headers=auth(), timeout=10)
        assert resp.status_code < 300, (one["labels"]["node"], resp.status_code, resp.text)

    def all_decided() -> bool:
        done = {r["fingerprint"] for r in _audit(url) if r["decision"] in TERMINAL}
        return all(a["fingerprint"] in done for a in bad) or None

    wait_until(all_decided, timeout=180, what="every pattern target decided")
    assert marked(markers) == set()
    rows = _audit(url)
    for a in bad:
        mine = [r for r in rows if r["fingerprint"] == a["fingerprint"]]
        # refused once, with the reason; never granted, never retried, never failed
        assert [r["decision"] for r in mine] == ["refused"], (a["labels"]["node"], mine)
        assert mine[0]["reason"], mine

    good = alert("HostMark", {"node": "node-b"})
    resp = requests.post(f"{url}/v1/alerts", json=payload(good), headers=auth(), timeout=10)
    assert resp.status_code < 300, resp.text
    wait_until(lambda: "acted" in _decisions(url, good["fingerprint"])
               or "failed" in _decisions(url, good["fingerprint"]) or None,
               timeout=120, what="the node-b action to finish")
    assert _decisions(url, good["fingerprint"]) == ["acted"], _audit(url)[-3:]
    assert marked(markers) == {"node-b"}

    # cooldown is keyed on the resolved host: a second alert for node-b does not act again
    again = alert("HostMark", {"node": "node-b"})
    requests.post(f"{url}/v1/alerts", json=payload(again), headers=auth(), timeout=10)
    wait_until(lambda: _decisions(url, again["fingerprint"]) or None, timeout=60,
               what="the second node-b alert to be decided")
    assert _decisions(url, again["fingerprint"]) == ["cooled_down"]
    assert marked(markers) == {"node-b"}

    # item 9c: the tokens the service holds never reach Ansible's children
    env = json.loads((markers / "node-b").read_text())
    dumped = json.dumps(env)
    assert TOKEN not in dumped and CONTROL_TOKEN not in dumped
    assert not any("TOKEN" in key for key in env)
    assert set(HOSTS) >= marked(markers)


def test_node_all_posted_to_a_real_alertmanager_acts_nowhere(tmp_path: Path,
                                                             inventory: Path) -> None:
    """The reported attack, end to end: `node="all"` posted to Alertmanager 0.25's API (routed
    to the webhook like any disk alert) is refused, audited once, and runs on no host."""
    port = free_port()
    book = {**REMEDIATION_PLAYBOOK, "match": {"alertname": ["NodeDiskFilling"]}}
    token_file = tmp_path / "am-webhook.token"
    token_file.write_text(TOKEN)
    am_config = render_one({
        "alertmanager_remediation_url": f"http://127.0.0.1:{port}/v1/alerts",
        "alertmanager_remediation_token_file": str(token_file),
        "alertmanager_group_wait": "1s", "alertmanager_group_interval": "1s",
        "alertmanager_repeat_interval": "1h"}, tmp_path / "alertmanager-render")
    url = f"http://127.0.0.1:{port}"
    with _start_service(tmp_path, inventory, book, port, {}), \
            alertmanager(tmp_path, am_config) as am_url:
        for node in ("all", "gpu", "node-a:node-b"):
            resp = requests.post(f"{am_url}/api/v2/alerts", timeout=5, json=[{
                "labels": {"alertname": "NodeDiskFilling", "node": node, "severity": "warning",
                           "component": "node"}, "annotations": {"summary": "attack"}}])
            assert resp.status_code == 200, resp.text

        def refused() -> list[dict] | None:
            rows = [r for r in _audit(url) if r["playbook"] == "host_mark"]
            return rows if len(rows) >= 3 else None

        rows = wait_until(refused, timeout=90, what="Alertmanager's deliveries to be decided")
        assert {r["decision"] for r in rows} == {"refused"}, rows
        assert marked(tmp_path / "markers") == set()

