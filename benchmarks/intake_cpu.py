"""CPU time per accepted alert on the webhook's intake path, in one process.

    .venv/bin/python benchmarks/intake_cpu.py [--payloads 300] [--alerts 10] [--threads 8]

The app (`create_app`) with its real group committer and a SQLite store in a temporary
directory; `--threads` threads post `--payloads` payloads of `--alerts` distinct alerts each
through Flask's test client (authentication, body limit, JSON, envelope and per-alert
validation, the committer's transaction with synchronous=FULL). No worker runs. Prints one JSON
line: process CPU time per accepted alert and accepted alerts/s.

Why next to benchmarks/webhook.py: on a shared, loaded machine the end-to-end benchmark's
numbers swing by several times between runs (other processes take the cores), while the CPU
time this process spends per alert barely moves; comparing two versions of the intake code is
done with this, alternating them (docs/performance.md, issue 25).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.remediation.helpers import alert, auth, payload, write_config, write_playbook  # noqa: E402
from trainwatch.remediation.app import create_app  # noqa: E402
from trainwatch.remediation.config import load_config  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payloads", type=int, default=300)
    parser.add_argument("--alerts", type=int, default=10)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-intake-") as tmp:
        work = Path(tmp)
        write_playbook(work / "playbooks", {
            "name": "page", "match": {"alertname": ["TrainingLossSpike"]},
            "target": ["training_job"], "steps": [{"action": "http", "url": "http://127.0.0.1:1/"}]})
        app = create_app(load_config(write_config(work, playbooks_dir=str(work / "playbooks"))))
        bodies = [json.dumps(payload(*[alert("TrainingLossSpike", {"training_job": f"j{k}-{i}"})
                                       for i in range(args.alerts)]))
                  for k in range(args.payloads)]
        headers = {**auth(), "Content-Type": "application/json"}

        def post(body: str) -> int:
            answer = app.test_client().post("/v1/alerts", data=body, headers=headers)
            if answer.status_code != 200:
                raise RuntimeError(f"{answer.status_code}: {answer.get_data(as_text=True)}")
            return int(answer.json["accepted"])

        cpu, wall = time.process_time(), time.perf_counter()
        with ThreadPoolExecutor(args.threads) as pool:
            accepted = sum(pool.map(post, bodies))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(json.dumps({"benchmark": "intake_cpu", "accepted": accepted,
                      "cpu_us_per_alert": round(cpu / accepted * 1e6, 1),
                      "alerts_per_s": round(accepted / wall, 1),
                      "load_average_1m": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
