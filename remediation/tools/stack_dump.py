"""Stack dumps of every rank process of a training job on this node, as JSON (read-only).

    python -m remediation.tools.stack_dump --job JOB [--py-spy PATH] [--timeout 30]

A rank process is one whose environment names the job (TRAINWATCH_JOB, else
TORCHELASTIC_RUN_ID) and carries RANK, as torchrun sets for its workers. Each is dumped with
`py-spy dump --pid N` (argv, no shell). Nothing is signalled or killed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from exporters.catalog import ENV_JOB
from remediation.labels import SAFE_VALUE


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def rank_processes(job: str) -> list[dict[str, object]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        env = _environ(int(entry.name))
        if "RANK" not in env:
            continue
        if env.get(ENV_JOB, env.get("TORCHELASTIC_RUN_ID")) != job:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()
        except OSError:
            continue
        found.append({"pid": int(entry.name), "rank": env.get("RANK"),
                      "local_rank": env.get("LOCAL_RANK"), "cmdline": cmdline[:500]})
    return sorted(found, key=lambda p: int(str(p["rank"])) if str(p["rank"]).isdigit() else 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stack_dump", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", required=True)
    parser.add_argument("--py-spy", default=None, help="py-spy binary (default: next to python)")
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    if not SAFE_VALUE.match(args.job):
        print("stack_dump: --job has characters outside the allowlist", file=sys.stderr)
        return 2
    py_spy = args.py_spy or shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print(f"stack_dump: py-spy not found ({py_spy})", file=sys.stderr)
        return 2
    procs = rank_processes(args.job)
    for proc in procs:
        try:
            out = subprocess.run([py_spy, "dump", "--pid", str(proc["pid"])],
                                 capture_output=True, text=True, timeout=args.timeout, check=False)
            proc["dump"] = out.stdout[-20000:]
            if out.returncode != 0:
                proc["error"] = out.stderr[-2000:]
        except subprocess.TimeoutExpired:
            proc["error"] = f"py-spy timed out after {args.timeout:g}s"
    print(json.dumps({"job": args.job, "processes": procs}))
    return 0 if procs else 3


if __name__ == "__main__":
    sys.exit(main())
