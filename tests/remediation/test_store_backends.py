"""The store's promises on both backends (issue 14: SQLite and PostgreSQL run the same suite):
exclusive claims across store instances (as across replicas), idempotency, the append-only
audit, counters that survive retention, the readiness probe, the reset-store marker; and on
PostgreSQL, a server restart during intake loses nothing that was answered 2xx."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from tests.remediation.helpers import alert, auth, payload, stub_server, write_config
from tests.remediation.processes import service_config, start_service
from tests.support.net import free_port, wait_until
from tests.support.postgres import PgCluster
from trainwatch.remediation.config import Config, load_config
from trainwatch.remediation.marker import StoreResetError, check_store, write_marker
from trainwatch.remediation.store import CLOCK_TOLERANCE, ClockSkew, NewIntent
from trainwatch.remediation.stores import open_store

REFUSED = (Exception,)  # sqlite3.IntegrityError or psycopg's RaiseException: the text matters


def configured(tmp_path: Path, section: dict[str, Any]) -> Config:
    return load_config(write_config(tmp_path, **section))


def new(fp: str, phase: str = "fire", state: str = "pending") -> NewIntent:
    return NewIntent(fingerprint=fp, starts_at="t", playbook="page", phase=phase,
                     alertname="A", labels={"j": fp}, annotations={}, target_key="k",
                     state=state)


def test_claims_are_exclusive_across_store_instances(tmp_path: Path,
                                                     store_section: dict[str, Any]) -> None:
    """Two store objects (two replicas) and eight threads claim 60 intents: each is claimed by
    exactly one claimant, and a redelivered key never makes a second intent."""
    config = configured(tmp_path, store_section)
    stores = [open_store(config), open_store(config)]
    with stores[0].transaction() as tx:
        ids = [tx.insert_intent(new(f"f{i}")) for i in range(60)]
        assert all(ids)
        assert tx.insert_intent(new("f0")) is None  # idempotency key exists
    with stores[1].transaction() as tx:
        assert tx.insert_intent(new("f1")) is None
    claimed: list[int] = []
    lock = threading.Lock()

    def claim_all(n: int) -> None:
        store = stores[n % 2]
        try:
            while (intent := store.claim(f"owner{n}", 60.0)) is not None:
                with lock:
                    claimed.append(intent.id)
        finally:
            store.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(claim_all, range(8)))
    assert sorted(claimed) == sorted(ids)  # every one once, none twice
    assert stores[0].state_counts() == {"running": 60}


def test_a_lease_holds_while_renewed_and_passes_on_when_it_expires(
        tmp_path: Path, store_section: dict[str, Any]) -> None:
    """Replica A claims with a short lease; replica B cannot take the intent while A renews,
    and takes it (same id, lease owner B) once A stops renewing (A died)."""
    config = configured(tmp_path, store_section)
    a, b = open_store(config), open_store(config)
    with a.transaction() as tx:
        intent_id = tx.insert_intent(new("lease1"))
    claimed = a.claim("replica-a", 3.0)
    assert claimed is not None and claimed.id == intent_id
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:  # A alive: renews faster than the lease runs out
        a.renew_leases("replica-a", 3.0)
        assert b.claim("replica-b", 3.0) is None
        time.sleep(0.2)  # the renewal cadence under test, not synchronisation
    taken = wait_until(lambda: b.claim("replica-b", 30.0), timeout=30,
                       what="the expired lease to be re-claimed")
    assert taken.id == intent_id and taken.lease_owner == "replica-b"
    a.renew_leases("replica-a", 30.0)  # A's late renewal does not take it back
    assert b.get_intent(intent_id).lease_owner == "replica-b"


def test_a_wall_clock_jump_does_not_hand_a_running_step_to_another_worker(
        tmp_path: Path, store_section: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25 item 7. Worker A of a replica claims an intent; the wall clock then leaps an
    hour ahead. Worker B of the same replica (same owner name, as the threads of one process
    share it) must not take the intent while A's lease is live: lease expiry is judged on the
    observer's monotonic clock, not by comparing wall-clock times. Once A stops renewing (it
    hung) B takes the intent over after the lease, and A, the same owner name, can no longer
    record a step: its claim's lease generation (the fencing token) is stale."""
    config = configured(tmp_path, store_section)
    a, b = open_store(config), open_store(config)
    with a.transaction() as tx:
        intent_id = tx.insert_intent(new("jump1"))
    owner = "host:1234:abcd"  # one replica: its worker threads share the owner name
    held = a.claim(owner, 2.0)
    assert held is not None and held.id == intent_id
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600.0)  # the clock leaps ahead
    with pytest.raises(ClockSkew):  # a leapt clock writes nothing, a claim least of all
        b.claim(owner, 2.0)
    monkeypatch.setattr(time, "time", real_time)  # and back
    assert b.claim(owner, 2.0) is None  # A's lease is live: the step is not run twice
    a.renew_leases(owner, 2.0)
    assert b.claim(owner, 2.0) is None
    taken = wait_until(lambda: b.claim(owner, 30.0), timeout=30,
                       what="the unrenewed lease to be taken over")
    assert taken.id == intent_id and taken.lease_gen > held.lease_gen
    with a.transaction() as tx:
        assert not tx.look(held.id).held_by(owner, held.lease_gen)  # A is fenced off
        assert tx.look(taken.id).held_by(owner, taken.lease_gen)


def test_a_wall_clock_jump_does_not_wipe_the_audit_or_the_cooldowns(
        tmp_path: Path, store_section: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25 item 8. Retention prunes against the wall clock; a clock 100 days ahead for a
    few seconds deleted every finished intent's audit rows and every grant, so the next alert
    inside a 1 h cooldown acted. Now retention refuses a clock that leapt ahead (against the
    monotonic clock since the previous prune) or moved backwards (before the previous prune,
    or before the newest recorded time), and a store whose clock leapt writes nothing at all
    (StoreClock: on SQLite against the monotonic clock since it opened, on PostgreSQL against
    the database's clock, which also dates every row)."""
    import trainwatch.remediation.store
    retention = 30 * 86400.0
    store = open_store(configured(tmp_path, store_section))
    with store.transaction() as tx:
        done = tx.insert_intent(new("f1", state="done"))
        tx.insert_intent(new("f1", "resolve", state="done"))
        tx.audit("acted", intent_id=done, playbook="page", action="http")
        tx.execute("INSERT INTO grants (at, playbook, target_key, intent_id, priority)"
                   " VALUES (?,?,?,?,?)", (time.time(), "page", "k", done, 1))

    def intact() -> None:
        assert [a["intent_id"] for a in store.list_audit(100)] == [done]
        assert len(store.list_intents(100)) == 2
        with store.transaction() as tx:  # the 1 h cooldown still sees the grant
            assert tx.grants_since(time.time() - 3600, "page", "k")[0] == 1

    assert store.prune(retention) == (0, 0)  # the hourly pass, nothing old
    real_time = time.time

    def prune_with_clock_off_by(seconds: float) -> str:
        """The worker's retention pass with the wall clock `seconds` off; why it refused."""
        monkeypatch.setattr(time, "time", lambda: real_time() + seconds)
        try:
            store.prune(retention)
            refused = ""
        except RuntimeError as exc:  # ClockSuspect
            refused = str(exc)
        monkeypatch.setattr(time, "time", real_time)  # corrected a few seconds later
        return refused

    refused = prune_with_clock_off_by(100 * 86400.0)
    intact()  # the old code deleted the audit row, both intents and the grant here
    assert "nothing" in refused and "+8640000 s" in refused, refused
    refused = prune_with_clock_off_by(-86400.0)
    intact()
    assert "nothing" in refused and "-86400 s" in refused, refused
    monkeypatch.setattr(trainwatch.remediation.store, "_boot_id", lambda: "another-host-or-boot")
    assert prune_with_clock_off_by(100 * 86400.0)
    intact()


def test_audit_is_append_only_and_counters_survive_retention(
        tmp_path: Path, store_section: dict[str, Any]) -> None:
    store = open_store(configured(tmp_path, store_section))
    with store.transaction() as tx:
        done = tx.insert_intent(new("f1", state="done"))
        tx.insert_intent(new("f1", "resolve", state="done"))
        waiting = tx.insert_intent(new("f2", state="awaiting_approval"))
        for intent_id, decision in ((done, "acted"), (waiting, "awaiting_approval")):
            tx.audit(decision, intent_id=intent_id, playbook="page", action="http")
    before = (store.decision_counts(), store.action_counts())
    assert before[1] == [("page", "http", "acted", 1)]
    with pytest.raises(REFUSED, match="append-only"), store.transaction() as tx:
        tx.execute("UPDATE audit SET reason='edited'")
    with pytest.raises(REFUSED, match="append-only"), store.transaction() as tx:
        tx.execute("DELETE FROM audit WHERE intent_id=?", (done,))  # newer than retention
    assert store.prune(-1) == (2, 1)
    assert {a["intent_id"] for a in store.list_audit(100)} == {waiting}
    assert (store.decision_counts(), store.action_counts()) == before
    with pytest.raises(REFUSED, match="append-only"), store.transaction() as tx:
        tx.execute("DELETE FROM audit WHERE intent_id=?", (waiting,))  # unfinished intent
    with pytest.raises(REFUSED, match="only moves forward"), store.transaction() as tx:
        tx.execute("UPDATE retention SET horizon=0")
    store.probe_commit()
    assert store.quick_check() == "ok" and store.ping()


def test_a_reset_store_is_noticed_through_the_marker(tmp_path: Path,
                                                     store_section: dict[str, Any]) -> None:
    config = configured(tmp_path, store_section)
    store = open_store(config)
    write_marker(config, store)
    check_store(config, accept_new=False)  # the same store: fine
    with store.transaction() as tx:  # the store is wiped (a reset, a restore of nothing)
        tx.execute("DROP TABLE meta")
    store.close()
    with pytest.raises(StoreResetError, match="--accept-new-store") as err:
        check_store(config, accept_new=False)
    assert "postgresql://" in str(err.value) if config.postgresql else "empty" in str(err.value)
    if config.postgresql:
        assert config.postgresql.password not in str(err.value)
    check_store(config, accept_new=True)


def test_postgresql_restart_during_intake_loses_no_answered_alert(
        tmp_path: Path, pg_cluster: PgCluster) -> None:
    """Deliveries keep coming while the server restarts (pg_ctl restart -m fast): some fail
    with 5xx (Alertmanager resends those), and every one answered 2xx is in the store after."""
    section = {"store": pg_cluster.database(tmp_path / "pg")}
    port = free_port()
    book = {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
            "target": ["training_job"], "steps": [{"action": "http", "url": "http://127.0.0.1:1/"}]}
    config = service_config(tmp_path, [book], port=port, dry_run=True, **section)
    answered: dict[str, int] = {}
    stop = threading.Event()

    def deliver(n: int) -> None:
        i = 0
        while not stop.is_set():
            fp = f"{n:02x}{i:06x}"
            i += 1
            body = payload(alert("TrainingLossSpike", {"training_job": fp}, fingerprint=fp))
            try:
                code = requests.post(f"http://127.0.0.1:{port}/v1/alerts", json=body,
                                     headers={"Authorization": svc_auth}, timeout=30
                                     ).status_code
            except requests.RequestException:  # counted as not answered 2xx
                code = 0
            answered[fp] = code

    svc_auth = auth()["Authorization"]
    with start_service(config, port) as svc:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(deliver, n) for n in range(4)]
            wait_until(lambda: sum(c == 200 for c in answered.values()) >= 40, timeout=60,
                       what="intake running before the restart")
            pg_cluster.restart()
            after = len(answered)
            wait_until(lambda: sum(c == 200 for fp, c in list(answered.items())[after:]) >= 40,
                       timeout=60, what="intake answering 2xx again after the restart")
            stop.set()
            for future in futures:
                future.result()
        ok = {fp for fp, code in answered.items() if code == 200}
        with psycopg.connect(host="127.0.0.1", port=pg_cluster.port, user="trainwatch",
                             password=pg_cluster.password, dbname=section["store"]["dbname"]
                             ) as conn:
            stored = {r[0] for r in conn.execute("SELECT fingerprint FROM intents")}
        assert ok <= stored, f"{len(ok - stored)} alerts answered 2xx are not in the store"
        assert Counter(answered.values())[200] == len(ok)
        assert requests.get(f"{svc.url}/readyz", timeout=10).status_code == 200
        log = svc.proc.log_text()
    assert pg_cluster.password not in log  # connection errors never show the password


def test_store_config_errors_are_clear_and_the_password_stays_out_of_sight(
        tmp_path: Path) -> None:
    from trainwatch.remediation.config import ConfigError
    with pytest.raises(ConfigError, match="backend postgresql needs dbname, password_file"):
        configured(tmp_path, {"store": {"backend": "postgresql", "host": "db", "user": "u"}})
    with pytest.raises(ConfigError, match=r"store\.password_file: cannot read"):
        configured(tmp_path, {"store": {"backend": "postgresql", "host": "db", "user": "u",
                                        "dbname": "d", "password_file": "missing.pw"}})
    with pytest.raises(ConfigError, match="store"):
        configured(tmp_path, {"store": {"backend": "mysql"}})
    pw = tmp_path / "pg.pw"
    pw.write_text("s3cret-password-value\n")
    pw.chmod(0o600)
    config = configured(tmp_path, {"store": {"backend": "postgresql", "host": "db",
                                             "user": "u", "dbname": "d",
                                             "password_file": str(pw)}})
    assert config.postgresql is not None and config.postgresql.password == "s3cret-password-value"
    assert "s3cret" not in repr(config) and "s3cret" not in config.store_location
    assert config.store_location == "postgresql://u@db:5432/d"


def test_health_and_metrics_read_either_store(service_factory: Any,
                                              store_section: dict[str, Any]) -> None:
    book = {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
            "target": ["training_job"], "steps": [{"action": "http", "url": "http://127.0.0.1:1/"}]}
    with service_factory([book], dry_run=True, **store_section) as svc:
        body = payload(alert("TrainingLossSpike", {"training_job": "m"}, fingerprint="abcd0001"))
        answer = svc.client.post("/v1/alerts", json=body, headers=auth()).json
        assert answer["accepted"] == 1, str(answer)
        svc.wait_idle()
        assert svc.client.get("/readyz").status_code == 200
        metrics = svc.client.get("/metrics").get_data(as_text=True)
        assert 'trainwatch_remediation_decisions_total{decision="dry_run"} 1.0' in metrics


def test_an_unreachable_or_refusing_database_stops_the_server_with_a_clear_message(
        tmp_path: Path, pg_cluster: PgCluster) -> None:
    import subprocess

    from tests.remediation.helpers import REPO, VENV_BIN
    section = pg_cluster.database(tmp_path / "pg")
    wrong = tmp_path / "wrong.pw"
    wrong.write_text("not-the-password-0123456789")
    wrong.chmod(0o600)
    for store in ({**section, "password_file": str(wrong)}, {**section, "port": free_port()}):
        config = write_config(tmp_path, store=store)
        done = subprocess.run([str(VENV_BIN / "remediation-server"), "--config", str(config),
                               "--port", str(free_port())], capture_output=True, text=True,
                              timeout=60, check=False, cwd=REPO)
        assert done.returncode == 2, done.stderr
        assert f"cannot open store postgresql://trainwatch@127.0.0.1:{store['port']}/" \
            in done.stderr
        assert "not-the-password" not in done.stderr and pg_cluster.password not in done.stderr


def test_a_database_replaced_under_the_service_stops_intake(
        service_factory: Any, tmp_path: Path, pg_cluster: PgCluster) -> None:
    """Issue 25 item 9, the PostgreSQL side: another store restored under the database's name
    while the service runs (here: renamed into place) is not written to as if it were the
    store the service opened: the reconnect finds another store id, intake answers 503 and
    /readyz fails, saying so (test_store_safety.py covers the SQLite file)."""
    section = pg_cluster.database(tmp_path / "pg")
    other = pg_cluster.database(tmp_path / "pg2")
    open_store(configured(tmp_path / "other", {"store": other})).close()  # another store
    book = {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
            "target": ["training_job"], "steps": [{"action": "http", "url": "http://127.0.0.1:1/"}]}
    with service_factory([book], start_worker=False, dry_run=True, store=section) as svc:
        first = svc.client.post("/v1/alerts", headers=auth(), json=payload(
            alert("TrainingLossSpike", {"training_job": "a"}, fingerprint="a1")))
        assert first.status_code == 200, first.text
        with pg_cluster.connect() as admin:
            def swap() -> bool:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                              " WHERE datname = ANY(%s)", ([section["dbname"], other["dbname"]],))
                try:
                    admin.execute(f'ALTER DATABASE "{section["dbname"]}" RENAME TO'
                                  f' "{section["dbname"]}_old"')
                except psycopg.errors.ObjectInUse:
                    return False
                admin.execute(f'ALTER DATABASE "{other["dbname"]}" RENAME TO'
                              f' "{section["dbname"]}"')
                return True
            wait_until(swap, timeout=30, what="the database swapped under the service")
        lost = svc.client.post("/v1/alerts", headers=auth(), json=payload(
            alert("TrainingLossSpike", {"training_job": "b"}, fingerprint="b1")))
        assert lost.status_code == 503 and "no longer the store" in lost.text, lost.text
        ready = svc.client.get("/readyz")
        assert ready.status_code == 503 and "no longer the store" in ready.text, ready.text


def test_recent_firing_intents_of_one_playbook_and_target(tmp_path: Path,
                                                          store_section: dict[str, Any]) -> None:
    """The read a stalled job's quarantine uses to find the job's diagnostics intent (issue 23):
    one playbook, one target, firing only, created since a time, newest first."""
    store = open_store(configured(tmp_path, store_section))
    try:
        with store.transaction() as tx:
            before = time.time() - 1
            ids = [tx.insert_intent(new(f"d{i}")) for i in range(3)]
            tx.insert_intent(new("d0", phase="resolve"))
            tx.insert_intent(NewIntent(
                fingerprint="other", starts_at="t", playbook="page", phase="fire",
                alertname="A", labels={}, annotations={}, target_key="k2"))
            rows = tx.recent_firing_intents("page", "k", before)
            assert [r["id"] for r in rows] == sorted(ids, reverse=True)
            assert all(r["phase"] == "fire" and r["target_key"] == "k" for r in rows)
            assert tx.recent_firing_intents("page", "k", time.time() + 60) == []
            assert tx.recent_firing_intents("other", "k", before) == []
    finally:
        store.close()


class ReplicaClock:
    """A replica's wall clock, `offset` seconds off the host's (the store takes it as `clock`)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


HUNDRED_DAYS = 100 * 86400.0


def _grant_times(store: Any) -> list[float]:
    with store.transaction() as tx:
        return [float(r[0]) for r in tx.execute("SELECT at FROM grants").fetchall()]


def test_a_replica_whose_clock_runs_ahead_dates_no_grant_into_the_future(
        service_factory: Any, store_section: dict[str, Any]) -> None:
    """Issue 36, class 6. A replica whose clock ran 100 days ahead wrote grants dated in the
    future, which every replica's cooldown and rate windows then counted for 100 days. Now
    time in the store comes from one clock (the database's on PostgreSQL, the host's on
    SQLite) and a replica whose clock is off it writes nothing: the alert it was sent is
    answered 5xx (Alertmanager delivers it to the other replicas, or again later), /readyz
    says why, and once its clock is right it acts, with a grant dated now."""
    book = {"name": "page", "match": {"alertname": ["TrainingLossSpike"]},
            "target": ["training_job"], "cooldown": "1h",
            "steps": [{"action": "http", "url": "http://HOST/hook/${labels.training_job}"}]}

    def deliver() -> Any:
        return svc.client.post("/v1/alerts", headers=auth(), json=payload(
            alert("TrainingLossSpike", {"training_job": "a"})))

    clock = ReplicaClock()
    with stub_server() as (hostport, state):
        book["steps"][0]["url"] = book["steps"][0]["url"].replace("HOST", hostport)
        with service_factory([book], clock=clock, **store_section) as svc:
            clock.offset = HUNDRED_DAYS
            resp = deliver()
            assert resp.status_code >= 500, resp.data
            ready = svc.client.get("/readyz")
            assert ready.status_code == 503 and "+8640000 s" in ready.get_data(as_text=True)
            assert state.posts() == [] and svc.store.list_intents(10) == []
            clock.offset = 0.0
            assert deliver().status_code == 200
            svc.wait_idle()
            wait_until(lambda: svc.client.get("/readyz").status_code == 200, timeout=30,
                       what="/readyz to be ready once the clock agrees")
            assert [p.path for p in state.posts()] == ["/hook/a"]
    (at,) = _grant_times(svc.store)
    assert abs(at - time.time()) < CLOCK_TOLERANCE  # not 100 days ahead


def test_a_replica_whose_clock_runs_ahead_deletes_no_other_replicas_rows(
        tmp_path: Path, store_section: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36, class 6. The replica 100 days ahead ran retention on another host: the checks
    against its own previous prune could not see its clock, so each hourly pass moved the
    horizon one step and deleted the other replica's audit rows and grants (the cooldowns).
    Now its retention passes are refused (nothing deleted) while its clock is off the store's,
    and the store's time, not the replica's, places the horizon."""
    import trainwatch.remediation.store

    retention = 30 * 86400.0
    config = configured(tmp_path, store_section)
    healthy = open_store(config)
    with healthy.transaction() as tx:
        done = tx.insert_intent(new("f1", state="done"))
        tx.insert_intent(new("f1", "resolve", state="done"))
        tx.audit("acted", intent_id=done, playbook="page", action="http")
        tx.add_grant(tx.now, "page", "k", done, 1)
    assert healthy.prune(retention) == (0, 0)
    clock = ReplicaClock()
    wrong = open_store(config, clock=clock)
    monkeypatch.setattr(trainwatch.remediation.store, "_boot_id", lambda: "another-host")
    clock.offset = HUNDRED_DAYS
    for _ in range(12):  # twelve hourly passes, each allowed a tenth of the retention
        with pytest.raises(ClockSkew):
            wrong.prune(retention, max_step=retention / 10)
    clock.offset = 0.0
    assert wrong.prune(retention, max_step=retention / 10) == (0, 0)
    assert [a["intent_id"] for a in healthy.list_audit(100)] == [done]
    assert len(healthy.list_intents(100)) == 2
    with healthy.transaction() as tx:  # the 1 h cooldown still sees the grant
        assert tx.grants_since(tx.now - 3600, "page", "k")[0] == 1


def test_the_stores_time_is_the_databases_on_postgresql_and_the_hosts_on_sqlite(
        tmp_path: Path, store_section: dict[str, Any]) -> None:
    """A replica's clock a little off (within the tolerance) dates nothing on PostgreSQL: the
    transaction's time is the server's. SQLite, one host, keeps the host's clock. Beyond the
    tolerance a PostgreSQL replica refuses from the start: it cannot even open the store."""
    config = configured(tmp_path, store_section)
    off = CLOCK_TOLERANCE / 2
    store = open_store(config, clock=lambda: time.time() + off)
    with store.transaction() as tx:
        now = tx.now
    expected = time.time() + (0.0 if store_section else off)
    assert abs(now - expected) < off / 4, (now, expected)
    if store_section:  # PostgreSQL
        with pytest.raises(ClockSkew, match="off the database server's"):
            open_store(config, clock=lambda: time.time() + HUNDRED_DAYS)
