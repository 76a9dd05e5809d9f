"""Another user's process on a shared node, trying to act for a job that is not its own.

Run as a second Unix user (tests/training/test_shared_node.py). It reports for its own job
(which must work), then tries, against the victim job: a NaN-loss datagram as its rank 0 and
one as a rank it does not have, a replay of a datagram captured from the victim, reading the
victim's commands on the command socket, reading the control token, and POSTing a rollback
to the control API. It prints one JSON line per attempt with what it saw.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import requests

from trainwatch.exporters.contract.catalog import command_socket
from trainwatch.exporters.contract.wire import VERSION, encode


def emit(attempt: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"attempt": attempt, **fields}) + "\n")
    sys.stdout.flush()


def datagram(job: str, rank: int, step: int, loss: float) -> bytes:
    return encode({"v": VERSION, "job": job, "rank": rank, "local_rank": rank,
                   "world_size": 8, "restarts": 0, "incarnation": "",
                   "steps": [[step, time.time(), 0.01, loss, 0.1, None, None]]})


def poll(path: str, job: str, rank: int) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5)
        conn.connect(path)
        conn.sendall(json.dumps({"job": job, "rank": rank}).encode() + b"\n")
        body = b""
        while chunk := conn.recv(65536):
            body += chunk
    return json.loads(body)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--victim", required=True)
    parser.add_argument("--own-job", required=True)
    parser.add_argument("--replay", type=Path, required=True)
    parser.add_argument("--token-file", type=Path, required=True)
    args = parser.parse_args()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    commands = command_socket(args.socket)

    sock.sendto(datagram(args.own_job, 0, 1, 0.5), args.socket)
    emit("own_report", pid=os.getpid())
    sock.sendto(datagram(args.victim, 0, 10**6, float("nan")), args.socket)
    emit("nan_as_victim")
    sock.sendto(datagram(args.victim, 5, 10**6, 0.1), args.socket)
    emit("extra_rank_as_victim")
    sock.sendto(args.replay.read_bytes(), args.socket)
    emit("replay")
    emit("poll_own", answer=poll(commands, args.own_job, 0))
    emit("poll_victim", answer=poll(commands, args.victim, 0))
    try:
        args.token_file.read_text()
        emit("read_token", readable=True)
    except OSError as exc:
        emit("read_token", readable=False, error=type(exc).__name__)
    response = requests.post(f"{args.url}/v1/jobs/{args.victim}/commands",
                             json={"type": "rollback", "args": {}}, timeout=5)
    emit("post_rollback", status=response.status_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
