"""Issue 26, acceptance 4: the `trainwatch` CLI against real services.

Real parts: remediation-server (its console script, over HTTP on a free port) with an
approvers file and a playbook that needs approval, whose http step reaches a real loopback
server; a real Alertmanager (Debian's) for silences. The CLI runs as its console script with
its settings from the environment or a config file, never a `--url`. `status` and `jobs`
against Prometheus and a real training job: tests/e2e/test_loss_spike_remediation.py.

On the code before: no `trainwatch` command; and a revoked approver's token kept working until
the service restarted (the approvers file was read once).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests
import yaml

from tests.remediation.helpers import (
    APPROVERS,
    REPO,
    TOKEN,
    VENV_BIN,
    alert,
    auth,
    payload,
    stub_server,
    write_config,
    write_playbook,
)
from tests.support.net import free_port, wait_until
from tests.support.procs import alertmanager, running
from trainwatch.remediation import approvers as approver_file

CLI = str(VENV_BIN / "trainwatch")


@dataclass
class Service:
    url: str
    workdir: Path
    approvers_file: Path
    hook_posts: list


@pytest.fixture()
def service(tmp_path: Path) -> Iterator[Service]:
    with stub_server() as (hostport, state):
        write_playbook(tmp_path / "playbooks", {
            "name": "page", "match": {"alertname": ["TrainingLossSpike"]},
            "target": ["training_job"], "requires_approval": True,
            "steps": [{"action": "http", "url": f"http://{hostport}/hook/${{labels.training_job}}"}]})
        port = free_port()
        config = write_config(tmp_path, port=port, playbooks_dir=str(tmp_path / "playbooks"))
        argv = [str(VENV_BIN / "remediation-server"), "--config", str(config)]
        with running(argv, tmp_path / "service.log", ready_url=f"http://127.0.0.1:{port}/readyz",
                     env={"PYTHONUNBUFFERED": "1"}, cwd=REPO):
            yield Service(f"http://127.0.0.1:{port}", tmp_path, tmp_path / "approvers",
                          state.requests)


def token_file(directory: Path, name: str, value: str) -> Path:
    path = directory / f"{name}.token"
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The console script, with only the given settings (no ~/.config file can leak in)."""
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", **env},
                          check=False)


def fire(svc: Service, job: str) -> int:
    resp = requests.post(f"{svc.url}/v1/alerts", headers=auth(), timeout=10,
                         json=payload(alert("TrainingLossSpike", {"training_job": job})))
    assert resp.status_code == 200, resp.text
    (intent,) = resp.json()["intents"]
    return intent


def state_of(svc: Service, intent: int) -> str:
    resp = requests.get(f"{svc.url}/v1/actions", headers=auth(), timeout=10,
                        params={"limit": 100})
    return {i["id"]: i["state"] for i in resp.json()["actions"]}[intent]


def env_for(svc: Service, who: str) -> dict[str, str]:
    tokens = {"webhook": TOKEN, **APPROVERS}
    return {"TRAINWATCH_REMEDIATION_URL": svc.url,
            "TRAINWATCH_TOKEN_FILE": str(token_file(svc.workdir, who, tokens[who])),
            "TRAINWATCH_APPROVERS_FILE": str(svc.approvers_file)}


def test_incidents_then_approve_and_reject_from_the_terminal(service: Service) -> None:
    first, second = fire(service, "llm-a"), fire(service, "llm-b")
    wait_until(lambda: {state_of(service, first), state_of(service, second)}
               == {"awaiting_approval"}, timeout=60, what="both intents awaiting approval")

    table = cli("incidents", env=env_for(service, "webhook"))
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["ID", "ALERT", "PLAYBOOK", "TARGET", "PHASE", "STATE",
                              "DECISION", "ACTED", "AGE"]
    assert [r.split()[:6] for r in rows] == [
        [str(second), "TrainingLossSpike", "page", "training_job=llm-b", "fire",
         "awaiting_approval"],
        [str(first), "TrainingLossSpike", "page", "training_job=llm-a", "fire",
         "awaiting_approval"]]
    as_json = json.loads(cli("incidents", "--json", "--state", "awaiting_approval",
                             env=env_for(service, "webhook")).stdout)
    assert [(r["id"], r["job"], r["state"]) for r in as_json] == [
        (second, "llm-b", "awaiting_approval"), (first, "llm-a", "awaiting_approval")]

    # the webhook token reads, but cannot decide
    refused = cli("approve", str(first), env=env_for(service, "webhook"))
    assert refused.returncode == 1 and "403" in refused.stderr
    assert state_of(service, first) == "awaiting_approval"

    done = cli("approve", str(first), env=env_for(service, "bob"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].split() == [str(first), "pending", "bob"]
    wait_until(lambda: [r.path for r in service.hook_posts] == ["/hook/llm-a"] or None,
               timeout=60, what="the approved action to act")
    rejected = cli("reject", str(second), "--json", env=env_for(service, "alice"))
    assert json.loads(rejected.stdout) == {"id": second, "state": "rejected", "by": "alice"}
    again = cli("approve", str(second), env=env_for(service, "alice"))
    assert again.returncode == 1 and "409" in again.stderr
    assert [r.path for r in service.hook_posts] == ["/hook/llm-a"]


def test_approvers_add_list_revoke_take_effect_without_a_restart(service: Service) -> None:
    env = env_for(service, "webhook")
    listed = cli("approvers", "list", env=env)
    assert listed.stdout.split() == ["NAME", "alice", "bob"]

    added = cli("approvers", "add", "carol", "--json", env=env)
    assert added.returncode == 0, added.stderr
    carol = json.loads(added.stdout)["token"]
    assert carol not in service.approvers_file.read_text()  # only its digest is stored
    assert json.loads(cli("approvers", "list", "--json", env=env).stdout) == [
        {"name": "alice"}, {"name": "bob"}, {"name": "carol"}]
    assert cli("approvers", "add", "carol", env=env).returncode == 2  # exists already

    first, intent = fire(service, "llm-c"), fire(service, "llm-d")
    wait_until(lambda: {state_of(service, first), state_of(service, intent)}
               == {"awaiting_approval"}, timeout=60, what="the intents awaiting approval")
    carol_env = {**env, "TRAINWATCH_TOKEN_FILE": str(token_file(service.workdir, "carol", carol))}
    # the running service re-reads the file: carol, added after it started, may approve
    approved = cli("approve", str(first), env=carol_env)
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.splitlines()[1].split() == [str(first), "pending", "carol"]
    revoked = cli("approvers", "revoke", "carol", env=env)
    assert revoked.returncode == 0, revoked.stderr
    assert approver_file.names(service.approvers_file) == ["alice", "bob"]
    # and once revoked, carol's token is refused at the next request, without a restart
    denied = cli("approve", str(intent), env=carol_env)
    assert denied.returncode == 1 and "401" in denied.stderr, denied.stderr
    assert state_of(service, intent) == "awaiting_approval"
    assert cli("approvers", "revoke", "carol", env=env).returncode == 2  # no such approver
    assert cli("approve", str(intent), env=env_for(service, "alice")).returncode == 0


@pytest.fixture()
def real_alertmanager(tmp_path: Path, real_binaries: dict[str, str]) -> Iterator[str]:
    config = tmp_path / "am.yml"
    config.write_text(yaml.safe_dump({"route": {"receiver": "none"},
                                      "receivers": [{"name": "none"}]}))
    with alertmanager(tmp_path, config) as url:
        yield url


def silences(url: str) -> list[dict]:
    resp = requests.get(f"{url}/api/v2/silences", timeout=10)
    resp.raise_for_status()
    return [s for s in resp.json() if s["status"]["state"] == "active"]


def test_silence_a_job_or_a_node_exactly(real_alertmanager: str, tmp_path: Path) -> None:
    env = {"TRAINWATCH_ALERTMANAGER_URL": real_alertmanager}
    done = cli("silence", "--job", "llm-7b", "--for", "2h", "--comment", "rollout", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split() == ["SILENCE", "MATCHER", "ENDS"]
    node = json.loads(cli("silence", "--node", "gpu-a1", "--for", "30m", "--json",
                          env=env).stdout)
    active = {s["id"]: s for s in silences(real_alertmanager)}
    assert len(active) == 2
    assert active[node["silence_id"]]["matchers"] == [
        {"name": "node", "value": "gpu-a1", "isRegex": False, "isEqual": True}]
    job = next(s for s in active.values() if s["id"] != node["silence_id"])
    assert job["matchers"][0]["name"] == "training_job" and job["comment"] == "rollout"
    assert "(trainwatch)" in job["createdBy"]

    # bad input: a clear error, exit 2, no silence created
    for bad in (["--job", "llm.*"], ["--job", "a|b"], ["--node", "-x"], ["--node", ""]):
        refused = cli("silence", *bad, "--for", "1h", env=env)
        assert refused.returncode == 2, (bad, refused.stdout, refused.stderr)
    for duration in ("0s", "30d", "forever"):
        assert cli("silence", "--job", "x", "--for", duration, env=env).returncode == 2
    assert len(silences(real_alertmanager)) == 2


def test_settings_come_from_a_file_or_the_environment(service: Service, tmp_path: Path
                                                      ) -> None:
    config = tmp_path / "cli.yml"
    config.write_text(yaml.safe_dump({
        "remediation_url": "http://127.0.0.1:1",  # the environment below wins over this
        "token_file": str(token_file(tmp_path, "file", TOKEN))}))
    by_file = cli("--config", str(config), "incidents", "--json",
                  env={"TRAINWATCH_REMEDIATION_URL": service.url})
    assert by_file.returncode == 0 and json.loads(by_file.stdout) == []
    by_env_file = cli("incidents", env={"TRAINWATCH_CONFIG": str(config)})
    assert by_env_file.returncode == 1 and "unreachable" in by_env_file.stderr

    config.write_text(yaml.safe_dump({"remediation_ur": service.url}))
    typo = cli("--config", str(config), "incidents", env={})
    assert typo.returncode == 2 and "remediation_ur" in typo.stderr
    missing = cli("incidents", env={"TRAINWATCH_REMEDIATION_URL": service.url})
    assert missing.returncode == 2 and "TRAINWATCH_TOKEN_FILE" in missing.stderr
    assert cli("--version", env={}).stdout.startswith("trainwatch ")


def test_an_approvers_file_made_invalid_accepts_nobody_until_fixed(tmp_path: Path) -> None:
    """ApproverFile, as the service holds it: re-read on change, fail closed on a bad file."""
    path = tmp_path / "approvers"
    token = approver_file.add(path, "alice")
    held = approver_file.ApproverFile(path, approver_file.load_approvers(path))
    assert held.current().identify(token) == "alice"
    good = path.read_text()
    path.write_text(good + "not a valid line\n")
    assert held.current().identify(token) is None
    path.write_text(good)
    assert held.current().identify(token) == "alice"
    path.unlink()
    assert held.current().identify(token) is None


def test_ids_and_durations_are_spelled_one_way(real_alertmanager: str, tmp_path: Path) -> None:
    """What int() and a `$`-anchored pattern let through is refused (exit 2) before any call:
    `approve 1_0` must not decide intent 10, Arabic-Indic digits are not an id, a silence
    cannot round to nothing, and a trailing newline is not part of a duration."""
    with stub_server() as (hostport, state):
        env = {"TRAINWATCH_REMEDIATION_URL": f"http://{hostport}",
               "TRAINWATCH_TOKEN_FILE": str(token_file(tmp_path, "alice", APPROVERS["alice"])),
               "TRAINWATCH_ALERTMANAGER_URL": real_alertmanager}
        for bad in ("1_0", "\u0661\u0660", "+10", " 10", "10\n", "0", "010", "1e3", "-1"):
            for verb in ("approve", "reject"):
                refused = cli(verb, bad, env=env)
                assert refused.returncode == 2, (verb, bad, refused.stdout, refused.stderr)
        for bad in ("1_0", "\u0661", "0"):
            assert cli("incidents", "--limit", bad, env=env).returncode == 2
        assert state.requests == []
        assert cli("approve", "10", env=env).returncode == 0  # the one spelling still works
        assert [r.path for r in state.requests] == ["/v1/actions/10/approve"]

    for duration in ("0.0001ms", "1h\n", "\u0661h", "1_0m", "30s", "0m", "1.5h", " 1h", "8d"):
        refused = cli("silence", "--job", "llm", "--for", duration, env=env)
        assert refused.returncode == 2, (duration, refused.stdout, refused.stderr)
    assert silences(real_alertmanager) == []
    assert cli("silence", "--job", "llm", "--for", "1m", env=env).returncode == 0


def test_config_durations_are_whole_strings() -> None:
    """The config and playbook durations: `$` matched before a trailing newline."""
    from trainwatch.remediation.durations import seconds

    assert seconds("5m") == 300.0
    for bad in ("5m\n", "\u0665m", "5m ", "1_0s"):
        with pytest.raises(ValueError, match="not a duration"):
            seconds(bad)


def test_silences_are_listed_and_only_the_clis_own_expired(real_alertmanager: str) -> None:
    env = {"TRAINWATCH_ALERTMANAGER_URL": real_alertmanager}
    mine = json.loads(cli("silence", "--job", "llm-9", "--for", "1h", "--json", env=env).stdout)
    now = datetime.now(timezone.utc)
    theirs = requests.post(f"{real_alertmanager}/api/v2/silences", timeout=10, json={
        "matchers": [{"name": "node", "value": "gpu-b2", "isRegex": False, "isEqual": True}],
        "startsAt": now.isoformat(), "endsAt": (now + timedelta(hours=2)).isoformat(),
        "createdBy": "carol", "comment": "PSU swap"}).json()["silenceID"]

    listed = json.loads(cli("silences", "--json", env=env).stdout)
    assert [(r["silence_id"], r["matchers"], r["created_by"]) for r in listed] == [
        (mine["silence_id"], 'training_job="llm-9"', listed[0]["created_by"]),
        (theirs, 'node="gpu-b2"', "carol")]
    assert listed[0]["created_by"].endswith(" (trainwatch)")
    assert cli("silences", env=env).stdout.splitlines()[0].split() == [
        "SILENCE", "MATCHERS", "ENDS", "BY", "COMMENT"]

    refused = cli("unsilence", theirs, env=env)  # a person's silence is theirs to end
    assert refused.returncode == 2 and "carol" in refused.stderr
    for bad in (theirs.upper(), theirs + "\n", "1", "../silences"):
        assert cli("unsilence", bad, env=env).returncode == 2
    done = cli("unsilence", mine["silence_id"], "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"silence_id": mine["silence_id"], "state": "expired"}
    assert [s["id"] for s in silences(real_alertmanager)] == [theirs]
    assert cli("unsilence", mine["silence_id"], env=env).returncode == 2  # already expired
