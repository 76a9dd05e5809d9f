"""Stalled-job diagnostics of every rank process of a training job on this node, as JSON.

    python -m trainwatch.exporters.node.tools.stack_dump --job JOB [--py-spy PATH] [--timeout 30]

A rank process is one that carries RANK (as torchrun sets for its workers) and whose
environment names the job the way every Trainwatch part does (trainwatch.exporters.contract.identity
job_from_env), or whose flight-recorder dump is filed under the job (the training client's
agreed id, which on several nodes can differ from what a node's environment derives).

Per rank: `py-spy dump --pid N` (argv, no shell) and a summary of PyTorch's flight recorder
as the rank dumped it on stall (trainwatch.exporters.rank.collectives: TRAINWATCH_DIAGNOSTICS_DIR
in the rank's environment). Across the ranks found: `collectives.waiting_in` (the newest
collective any rank is inside), `collectives.not_entered` (ranks that never entered it: the
ones the others wait for), `collectives.elsewhere` (ranks inside another collective than most
ranks here, or inside none while most are, on any process group: where the peers wait on a
group other than the default one, whose sequence numbers then tell nothing),
`collectives.stopped` (rank processes stopped by a signal, SIGSTOP or a debugger: state `T` in
/proc, read before any py-spy attaches), `collectives.silent` (ranks that wrote no readable
flight-recorder dump while a peer did: their monitor thread stopped with them) and
`collectives.suspects`, the ranks the stall is blamed on: those stopped, not entered or
elsewhere, failing all three the silent ones. The remediation service merges the records of
every node of the job and runs `analyse` again over all their processes (one node sees only
its own ranks), then maps the suspects to nodes
(trainwatch.remediation.faults.suspects_from_records).
`--scheduler-node NAME` leaves out rank processes a scheduler started for another node
(SLURMD_NODENAME in their environment), for test clusters whose nodes share one machine.
The output is one JSON line of at most MAX_OUTPUT characters (the py-spy dumps are cut to
their tails to fit), so the remediation audit keeps it whole. Read-only:
nothing is signalled or killed. The dump file is opened without following links, must be a
regular file owned by the rank's user and below a size limit, and only parsed fields reach
the output, never the file's text.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from trainwatch.exporters.contract.catalog import ENV_DIAGNOSTICS_DIR
from trainwatch.exporters.contract.identity import is_job_name, job_from_env
from trainwatch.exporters.rank.collectives import summarise

MAX_DUMP_BYTES = 16 << 20
LAST_ENTRIES = 5
# below the remediation ansible action's capture limit (remediation/actions/ansible.py
# OUTPUT_LIMIT), which keeps the tail of a task's stdout: a longer line would lose its start
MAX_OUTPUT = 19000
# the environment variable Slurm sets in every task it starts: the node it started it for
SCHEDULER_NODE_ENV = "SLURMD_NODENAME"
# ... and the job it started it for: remediation requeues this job, not every job on the node
SCHEDULER_JOB_ENV = "SLURM_JOB_ID"


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


def _dump_path(env: dict[str, str], job: str) -> Path | None:
    rank = env.get("RANK", "")
    directory = env.get(ENV_DIAGNOSTICS_DIR, "")
    if not (rank.isascii() and rank.isdigit() and directory.startswith("/")):
        return None
    return Path(directory, job, f"rank{int(rank)}.json")


def _read_dump(path: Path, uid: int) -> dict[str, Any]:
    """The rank's flight-recorder dump, refused unless it is a small regular file of its own."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"no flight recorder dump ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            raise ValueError("flight recorder dump is not a regular file of the rank's user")
        if info.st_size > MAX_DUMP_BYTES:
            raise ValueError("flight recorder dump too large")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_DUMP_BYTES + 1)
    finally:
        os.close(fd)
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        raise ValueError("flight recorder dump is not JSON") from None
    if not isinstance(document, dict) or not isinstance(document.get("entries"), list):
        raise ValueError("flight recorder dump has no entries")
    return document


def summarise_recorder(document: dict[str, Any]) -> dict[str, Any]:
    """The fields a person needs: the newest collective entered, the ones in flight."""
    entries = [e for e in document["entries"] if isinstance(e, dict)]
    default = [e for e in entries if str((e.get("process_group") or [""])[0]) == "0"
               and isinstance(e.get("collective_seq_id"), int) and not e.get("is_p2p")]

    def brief(entry: dict[str, Any]) -> dict[str, Any]:
        group = entry.get("process_group") or ["", ""]
        return {"seq": entry.get("collective_seq_id"), "op": str(entry.get("profiling_name"))[:64],
                "group": str(group[-1])[:64], "state": str(entry.get("state"))[:16],
                "finished": bool(entry.get("retired", True)),
                "started": (entry["time_created_ns"] / 1e9
                            if isinstance(entry.get("time_created_ns"), int) else None)}

    return {
        "last_seq": max((e["collective_seq_id"] for e in default), default=None),
        # the collective it is inside on any group, as the training client names it (0: none)
        "collective_id": summarise(entries)[2],
        "in_flight": [brief(e) for e in entries if not e.get("retired", True)][:LAST_ENTRIES],
        "last_entries": [brief(e) for e in default[-LAST_ENTRIES:]],
    }


def analyse(procs: list[dict[str, Any]]) -> dict[str, Any]:
    """Which ranks the others wait for: those stopped by a signal; failing these, those that
    never entered the newest collective any rank is inside (by the default group's sequence
    numbers) and those inside another collective than most; failing these, those that wrote
    no flight-recorder dump while a peer did. Runs per node here and again in remediation over
    the processes of every node of the job."""
    seqs = {p["rank"]: p["flight_recorder"]["last_seq"] for p in procs
            if isinstance(p.get("flight_recorder"), dict)
            and p["flight_recorder"]["last_seq"] is not None}
    waiting = [p["flight_recorder"]["last_seq"] for p in procs
               if isinstance(p.get("flight_recorder"), dict)
               and any(e["seq"] == p["flight_recorder"]["last_seq"]
                       for e in p["flight_recorder"]["in_flight"])]
    result: dict[str, Any] = {
        "unknown": sorted((p["rank"] for p in procs if p["rank"] not in seqs), key=_rank_key),
        "waiting_in": max(waiting) if waiting else None, "not_entered": [], "entered": []}
    ids = {p["rank"]: p["flight_recorder"].get("collective_id", 0) for p in procs
           if isinstance(p.get("flight_recorder"), dict)}
    shared = Counter(ids.values())
    most = max(shared.values(), default=0)
    result["elsewhere"] = sorted((r for r, i in ids.items() if shared[i] < most), key=_rank_key)
    if result["waiting_in"] is not None:
        result["not_entered"] = sorted((r for r, s in seqs.items() if s < result["waiting_in"]),
                                       key=_rank_key)
        result["entered"] = sorted((r for r, s in seqs.items() if s >= result["waiting_in"]),
                                   key=_rank_key)
    result["stopped"] = sorted((p["rank"] for p in procs if p.get("state") == "T"),
                               key=_rank_key)
    dumped = any(isinstance(p.get("flight_recorder"), dict) for p in procs)
    result["silent"] = sorted((p["rank"] for p in procs if dumped
                               and not isinstance(p.get("flight_recorder"), dict)), key=_rank_key)
    # A rank stopped by a signal is where the job stopped: the ranks it blocks wait, and
    # their sequence numbers can be behind the stopped rank's (it may have queued its next
    # collectives before it stopped), so with half the ranks stopped the waiting half would
    # look "not entered". Stopped ranks, when there are any, are the suspects alone.
    behind = {*result["not_entered"], *result["elsewhere"]}
    named = set(result["stopped"]) or behind
    result["suspects"] = sorted(named or set(result["silent"]), key=_rank_key)
    return result


def _rank_key(rank: Any) -> int:
    return int(rank) if str(rank).isdigit() else 0


def _uid(pid: int) -> int | None:
    try:
        return Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return None


def _state(pid: int) -> str | None:
    """The process state letter of /proc/<pid>/stat (`T`: stopped by a signal)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()  # the command name may hold spaces and ')'
    return fields[0] if fields else None


def rank_processes(job: str, scheduler_node: str | None = None) -> list[dict[str, Any]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = _environ(pid)
        if "RANK" not in env:
            continue
        dump = _dump_path(env, job)
        uid = _uid(pid)
        if job_from_env(env) != job and not (dump is not None and dump.exists()):
            continue
        if scheduler_node and env.get(SCHEDULER_NODE_ENV, scheduler_node) != scheduler_node:
            continue  # started by the scheduler for another node on this machine
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()
        except OSError:
            continue
        proc: dict[str, Any] = {"pid": pid, "rank": env.get("RANK"),
                                "scheduler_job": env.get(SCHEDULER_JOB_ENV),
                                "local_rank": env.get("LOCAL_RANK"), "state": _state(pid),
                                "cmdline": cmdline[:500]}
        if dump is None or uid is None:
            proc["flight_recorder"] = f"not configured ({ENV_DIAGNOSTICS_DIR} unset)"
        else:
            try:
                proc["flight_recorder"] = summarise_recorder(_read_dump(dump, uid))
            except ValueError as exc:
                proc["flight_recorder"] = str(exc)
        found.append(proc)
    return sorted(found, key=lambda p: _rank_key(p["rank"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stack_dump", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", required=True)
    parser.add_argument("--py-spy", default=None, help="py-spy binary (default: next to python)")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--scheduler-node", default="",
                        help="only ranks the scheduler started for this node "
                             f"({SCHEDULER_NODE_ENV}); empty: every rank of the job")
    args = parser.parse_args(argv)
    if not is_job_name(args.job):  # fullmatch: no trailing newline, one spelling per job
        print("stack_dump: --job is not a training job name", file=sys.stderr)
        return 2
    if args.scheduler_node and not is_job_name(args.scheduler_node):
        print("stack_dump: --scheduler-node is not a node name", file=sys.stderr)
        return 2
    py_spy = args.py_spy or shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print(f"stack_dump: py-spy not found ({py_spy})", file=sys.stderr)
        return 2
    # every state is read before py-spy attaches to any process
    procs = rank_processes(args.job, args.scheduler_node or None)
    for proc in procs:
        try:
            out = subprocess.run([py_spy, "dump", "--pid", str(proc["pid"])],
                                 capture_output=True, text=True, timeout=args.timeout, check=False)
            proc["dump"] = out.stdout[-20000:]
            if out.returncode != 0:
                proc["error"] = out.stderr[-2000:]
        except subprocess.TimeoutExpired:
            proc["error"] = f"py-spy timed out after {args.timeout:g}s"
    print(fit({"job": args.job, "collectives": analyse(procs), "processes": procs}))
    return 0 if procs else 3


def fit(report: dict[str, Any], limit: int = MAX_OUTPUT) -> str:
    """The report as one JSON line of at most `limit` characters where the evidence allows:
    the py-spy dumps are cut to their tails (the innermost frames), evenly, until it fits."""
    text = json.dumps(report)
    procs = [p for p in report["processes"] if p.get("dump")]
    share = max((len(p["dump"]) for p in procs), default=0)
    while len(text) > limit and share > 0:
        share //= 2
        for proc in procs:
            proc["dump"] = proc["dump"][-share:] if share else ""
        text = json.dumps(report)
    return text


if __name__ == "__main__":
    sys.exit(main())
