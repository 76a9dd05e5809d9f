"""Benchmark the remediation webhook: accepted alerts/s and latency of the 2xx at 200 req/s.

    .venv/bin/python benchmarks/webhook.py [--seconds 10] [--rate 200] [--store postgresql]

Trainwatch (remediation-server under gunicorn: authenticate, validate, commit the intent to
SQLite WAL with synchronous=FULL, answer; a worker acts afterwards) is compared, in the same
run and on the same action target, with the naive design several existing receivers use: run
the action synchronously before answering (here one HTTP call per alert to a target that takes
20 ms, no persistence). Both servers are gunicorn gthread with the same thread count.

The load generator runs in a second process and posts real-shaped Alertmanager v4 payloads
(distinct fingerprints, so every request is new work) over loopback:
  * latency: open loop at --rate req/s (1 alert each) for --seconds; latency is measured from
    the scheduled send time, so a stalled server cannot hide queueing (no coordinated omission);
  * throughput: closed loop, 8 connections, payloads of 10 alerts, for --seconds / 2;
  * slow clients: --slow (64) connections that stay open doing nothing useful (a third idle, a
    third sending headers a byte at a time, a third sending a body a byte at a time; each one
    reconnects when the server cuts it off), while the others post alerts and ask for the
    health endpoint at --rate req/s in total, open loop; a request not answered within 5 s
    counts as 5 s.
With --store postgresql the service's store is a database in a throwaway PostgreSQL server
started for the run (tests/support/postgres.py; synchronous_commit on), as replicas on several
hosts would use it.
Prints one line per phase and, last, a JSON object with both results and the ratios.
"""

from __future__ import annotations

import argparse
import atexit
import json
import multiprocessing as mp
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.net import free_port, wait_until  # noqa: E402
from trainwatch.exporters.contract.catalog import PORTS  # noqa: E402

TOKEN = secrets.token_hex(16)
ACTION_SECONDS = 0.02
THREADS = 8


# --- the action target both designs call --------------------------------------------------------
class _SlowTarget(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        time.sleep(ACTION_SECONDS)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


# --- the naive baseline: act synchronously, then answer ------------------------------------------
def serve_baseline(port: int, target: str) -> None:
    from flask import Flask, jsonify, request
    from gunicorn.app.base import BaseApplication

    app = Flask("naive-receiver")
    session = requests.Session()

    @app.post("/v1/alerts")
    def alerts() -> Any:
        if request.headers.get("Authorization") != f"Bearer {TOKEN_FROM_ENV}":
            return jsonify({"error": "unauthorized"}), 401
        payload = request.get_json()
        for alert in payload["alerts"]:
            session.post(f"http://{target}/act", json=alert["labels"], timeout=10)
        return jsonify({"ok": True})

    @app.get("/healthz")
    def healthz() -> Any:
        return jsonify({"status": "ok"})

    class Server(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            for key, value in {"bind": f"127.0.0.1:{port}", "workers": 1,
                               "worker_class": "gthread", "threads": THREADS,
                               "loglevel": "warning", "accesslog": None}.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            return app

    Server().run()


TOKEN_FROM_ENV = os.environ.get("BENCH_TOKEN", "")


# --- load generation (second process) ------------------------------------------------------------
def _payload(n_alerts: int) -> bytes:
    alerts = [{"status": "firing",
               "labels": {"alertname": "TrainingLossSpike",
                          "training_job": f"job{secrets.randbelow(50)}",
                          "severity": "warning", "component": "training",
                          "instance": f"10.0.0.7:{PORTS['training_exporter']}", "rank": "0",
                          "node": "gpu-node-07"},
               "annotations": {"summary": "loss spiked", "runbook_url": "https://runbooks/x"},
               "startsAt": "2026-11-21T18:03:15.119Z", "endsAt": "0001-01-01T00:00:00Z",
               "generatorURL": f"http://monitor-01:{PORTS['prometheus']}/graph?g0.expr=x",
               "fingerprint": secrets.token_hex(8)} for _ in range(n_alerts)]
    return json.dumps({"receiver": "remediation", "status": "firing", "alerts": alerts,
                       "groupLabels": {"alertname": "TrainingLossSpike"},
                       "commonLabels": {"alertname": "TrainingLossSpike"},
                       "commonAnnotations": {}, "externalURL": f"http://monitor-01:{PORTS['alertmanager']}",
                       "version": "4", "groupKey": "{}:{alertname=\"TrainingLossSpike\"}",
                       "truncatedAlerts": 0}).encode()


def _generate(url: str, rate: float, seconds: float, out: Any) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    local = threading.local()

    def post(body: bytes) -> int:
        if not hasattr(local, "s"):
            local.s = requests.Session()
        return local.s.post(url, data=body, headers=headers, timeout=30).status_code

    result: dict[str, Any] = {}
    # open loop at a fixed rate
    n = int(rate * seconds)
    bodies = [_payload(1) for _ in range(n)]
    latencies: list[float] = []
    codes: dict[int, int] = {}
    lock = threading.Lock()
    start = time.perf_counter() + 0.2

    def one(i: int) -> None:
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        try:
            code = post(bodies[i])
        except requests.RequestException:
            code = 0
        with lock:
            latencies.append(time.perf_counter() - scheduled)
            codes[code] = codes.get(code, 0) + 1

    with ThreadPoolExecutor(64) as pool:
        list(pool.map(one, range(n)))
    latencies.sort()
    result["latency"] = {"requests": n, "codes": codes,
                         "p50_ms": 1000 * latencies[len(latencies) // 2],
                         "p99_ms": 1000 * latencies[int(len(latencies) * 0.99) - 1],
                         "mean_ms": 1000 * statistics.fmean(latencies)}
    # closed loop throughput
    batch, conns, duration = 10, 8, max(seconds / 2, 2.0)
    stop = time.perf_counter() + duration
    accepted = [0] * conns

    def loop(k: int) -> None:
        while time.perf_counter() < stop:
            try:
                if post(_payload(batch)) == 200:
                    accepted[k] += batch
            except requests.RequestException:
                pass

    t0 = time.perf_counter()
    with ThreadPoolExecutor(conns) as pool:
        list(pool.map(loop, range(conns)))
    result["throughput"] = {"alerts_per_s": sum(accepted) / (time.perf_counter() - t0),
                            "alerts_per_request": batch, "connections": conns}
    out.put(result)


SLOW_PREFIXES = (b"", b"POST /v1/alerts HTTP/1.1\r\nHost: remediation\r\n",
                 b"POST /v1/alerts HTTP/1.1\r\nHost: remediation\r\nContent-Type: "
                 b"application/json\r\nContent-Length: 100000\r\n\r\n")
SLOW_TIMEOUT = 5.0


def _slow_client(host: str, port: int, kind: int, stop: threading.Event,
                 reconnects: list[int]) -> None:
    """Hold one connection open, sending a byte a second (idle ones send nothing); reconnect
    whenever the server closes it, as a slowloris would."""
    while not stop.is_set():
        try:
            with socket.create_connection((host, port), timeout=5) as sock:
                if SLOW_PREFIXES[kind]:
                    sock.sendall(SLOW_PREFIXES[kind])
                while not stop.wait(1.0):
                    if kind:
                        sock.sendall(b"X-Slow: y\r\n"[:1] if kind == 1 else b" ")
                    else:
                        sock.setblocking(False)
                        try:
                            if sock.recv(1) == b"":
                                break
                        except BlockingIOError:
                            pass
                        sock.setblocking(True)
        except OSError:
            pass
        reconnects[0] += 1
        stop.wait(0.1)


def _generate_slow(base: str, health: str, n_slow: int, rate: float, seconds: float,
                   out: Any) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    host, port = base.split("//", 1)[1].split(":")
    stop = threading.Event()
    reconnects = [0]
    slow = [threading.Thread(target=_slow_client, args=(host, int(port), i % 3, stop,
                                                       reconnects), daemon=True)
            for i in range(n_slow)]
    for t in slow:
        t.start()
    time.sleep(1.0)  # every slow connection is open before the measured requests start
    local = threading.local()
    n = int(rate * seconds)
    bodies = [_payload(1) for _ in range(n)]
    latencies: dict[str, list[float]] = {"alerts": [], "health": []}
    codes: dict[int, int] = {}
    lock = threading.Lock()
    start = time.perf_counter() + 0.2

    def one(i: int) -> None:
        if not hasattr(local, "s"):
            local.s = requests.Session()
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        which = "alerts" if i % 2 == 0 else "health"
        try:
            if which == "alerts":
                code = local.s.post(f"{base}/v1/alerts", data=bodies[i], headers=headers,
                                    timeout=SLOW_TIMEOUT).status_code
            else:
                code = local.s.get(f"{base}{health}", timeout=SLOW_TIMEOUT).status_code
            took = time.perf_counter() - scheduled
        except requests.RequestException:
            code, took = 0, SLOW_TIMEOUT
        with lock:
            latencies[which].append(took)
            codes[code] = codes.get(code, 0) + 1

    with ThreadPoolExecutor(64) as pool:
        list(pool.map(one, range(n)))
    stop.set()
    result: dict[str, Any] = {"slow_connections": n_slow, "requests": n, "codes": codes,
                              "slow_reconnects": reconnects[0]}
    for which, values in latencies.items():
        values.sort()
        result[which] = {"p50_ms": 1000 * values[len(values) // 2],
                         "p99_ms": 1000 * values[max(int(len(values) * 0.99) - 1, 0)]}
    every = sorted(latencies["alerts"] + latencies["health"])
    result["p99_ms"] = 1000 * every[max(int(len(every) * 0.99) - 1, 0)]
    out.put(result)


def measure_slow(base: str, health: str, n_slow: int, rate: float, seconds: float
                 ) -> dict[str, Any]:
    queue: Any = mp.Queue()
    proc = mp.Process(target=_generate_slow, args=(base, health, n_slow, rate, seconds, queue))
    proc.start()
    result = queue.get(timeout=seconds * 20 + 120)
    proc.join(30)
    return result


def measure(url: str, rate: float, seconds: float) -> dict[str, Any]:
    queue: Any = mp.Queue()
    proc = mp.Process(target=_generate, args=(url, rate, seconds, queue))
    proc.start()
    result = queue.get(timeout=seconds * 10 + 120)
    proc.join(30)
    return result


def _start(argv: list[str], url: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    wait_until(lambda: requests.get(url, timeout=1).status_code == 200, timeout=60,
               what=f"{argv[0]} ready")
    return proc


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, 15)
    proc.wait(20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--slow", type=int, default=64, help="slow connections (0: skip)")
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    args = parser.parse_args()
    if args.seconds <= 0 or args.rate <= 0:
        parser.error("--seconds and --rate must be positive")

    load_before = os.getloadavg()[0]
    target_server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowTarget)
    target_server.daemon_threads = True
    threading.Thread(target=target_server.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{target_server.server_address[1]}"
    results: dict[str, Any] = {}
    pg = None
    if args.store == "postgresql":
        from tests.support.postgres import PgCluster
        pg = PgCluster()
        atexit.register(pg.stop)  # also when a phase fails
    with tempfile.TemporaryDirectory(prefix="bench-webhook-") as tmp:
        work = Path(tmp)
        store = {"store": pg.database(work)} if pg else {}
        (work / "token").write_text(TOKEN)
        (work / "playbooks").mkdir()
        (work / "playbooks" / "bench.yaml").write_text(yaml.safe_dump({
            "name": "bench", "match": {"alertname": ["TrainingLossSpike"]},
            "target": ["training_job"],
            "steps": [{"action": "http", "url": f"http://{target}/act/${{labels.training_job}}"}]}))
        port = free_port()
        config = work / "remediation.yml"
        config.write_text(yaml.safe_dump({
            "bind": "127.0.0.1", "port": port, "webhook_token_file": str(work / "token"),
            "store_path": str(work / "store.sqlite"), "prometheus_url": "http://127.0.0.1:1",
            "alertmanager_url": "http://127.0.0.1:1",
            "training_exporter_token_file": str(work / "token"),
            "playbooks_dir": str(work / "playbooks"), "http_threads": THREADS,
            "circuit_breaker": {"max_actions": 1000000, "window": "1h"}, **store}))
        env = {**os.environ, "BENCH_TOKEN": TOKEN}
        venv_bin = Path(sys.executable).parent
        proc = _start([str(venv_bin / "remediation-server"), "--config", str(config)],
                      f"http://127.0.0.1:{port}/readyz", env, work / "trainwatch.log")
        try:
            results["trainwatch"] = measure(f"http://127.0.0.1:{port}/v1/alerts", args.rate,
                                            args.seconds)
            if args.slow:
                results["trainwatch"]["slow"] = measure_slow(
                    f"http://127.0.0.1:{port}", "/readyz", args.slow, args.rate, args.seconds)
        finally:
            _stop(proc)
        bport = free_port()
        proc = _start([sys.executable, __file__, "--serve-baseline", str(bport), target],
                      f"http://127.0.0.1:{bport}/healthz", env, work / "baseline.log")
        try:
            results["naive_sync"] = measure(f"http://127.0.0.1:{bport}/v1/alerts", args.rate,
                                            args.seconds)
            if args.slow:
                results["naive_sync"]["slow"] = measure_slow(
                    f"http://127.0.0.1:{bport}", "/healthz", args.slow, args.rate, args.seconds)
        finally:
            _stop(proc)
    target_server.shutdown()

    for name, res in results.items():
        lat, thr = res["latency"], res["throughput"]
        print(f"{name:12s} at {args.rate:.0f} req/s: p50 {lat['p50_ms']:.1f} ms, "
              f"p99 {lat['p99_ms']:.1f} ms, codes {lat['codes']}; "
              f"closed loop {thr['alerts_per_s']:.0f} alerts/s")
        if "slow" in res:
            slow = res["slow"]
            print(f"{name:12s} with {slow['slow_connections']} slow connections open: alerts "
                  f"p99 {slow['alerts']['p99_ms']:.1f} ms, health p99 "
                  f"{slow['health']['p99_ms']:.1f} ms, codes {slow['codes']}")
    tw, base = results["trainwatch"], results["naive_sync"]
    summary = {
        "benchmark": "webhook",
        "store": args.store,
        "machine": f"{platform.machine()} {os.cpu_count()} cpu, {platform.platform()}",
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "rate_req_per_s": args.rate,
        "seconds": args.seconds,
        "accepted_alerts_per_s": round(tw["throughput"]["alerts_per_s"], 1),
        "p50_ms": round(tw["latency"]["p50_ms"], 2),
        "p99_ms": round(tw["latency"]["p99_ms"], 2),
        "codes": tw["latency"]["codes"],
        "baseline_naive_sync": {
            "accepted_alerts_per_s": round(base["throughput"]["alerts_per_s"], 1),
            "p50_ms": round(base["latency"]["p50_ms"], 2),
            "p99_ms": round(base["latency"]["p99_ms"], 2),
            "codes": base["latency"]["codes"]},
        "ratios": {
            "throughput_x": round(tw["throughput"]["alerts_per_s"]
                                  / max(base["throughput"]["alerts_per_s"], 1e-9), 2),
            "p99_baseline_over_trainwatch": round(base["latency"]["p99_ms"]
                                                  / max(tw["latency"]["p99_ms"], 1e-9), 2)},
        "goals_met": {"p99_le_25ms": tw["latency"]["p99_ms"] <= 25.0,
                      "alerts_per_s_ge_500": tw["throughput"]["alerts_per_s"] >= 500},
    }
    if "slow" in tw:
        summary["slow_connections"] = {
            "connections": args.slow,
            "trainwatch": {k: tw["slow"][k] for k in ("alerts", "health", "p99_ms", "codes",
                                                      "slow_reconnects")},
            "baseline_gunicorn_gthread": {k: base["slow"][k] for k in (
                "alerts", "health", "p99_ms", "codes", "slow_reconnects")},
            "p99_baseline_over_trainwatch": round(base["slow"]["p99_ms"]
                                                  / max(tw["slow"]["p99_ms"], 1e-9), 2)}
        summary["goals_met"]["slow_p99_le_100ms"] = tw["slow"]["p99_ms"] <= 100.0
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-baseline":
        serve_baseline(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(main())
