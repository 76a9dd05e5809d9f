"""What the quarantine tests build around the Slurm cluster: the inventory with its node
mapping, a bin dir whose scontrol records every call before running the real one, the
service's scheduler config and the quarantine playbooks."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.slurm.cluster import SlurmCluster

HOSTS = {"node-a": "tw-gpu-01", "node-b": "tw-gpu-02", "node-c": "tw-gpu-03"}

RECORDING = """#!{python}
import json, os, sys, time
with open({log!r}, "a") as f:
    f.write(json.dumps([{tool!r}, *sys.argv[1:]]) + "\\n")
with open({log!r} + ".times", "a") as f:
    f.write(json.dumps([time.time(), {tool!r}, *sys.argv[1:]]) + "\\n")
fault = {fault!r}
if os.path.exists(fault):  # an injected fault: print the file, exit 0, run nothing
    sys.stdout.write(open(fault).read())
    sys.exit(0)
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
"""


def write_inventory(path: Path, host_vars: dict[str, dict[str, Any]] | None = None) -> Path:
    """The three GPU hosts, local connections, each mapped to its Slurm node."""
    hosts = {host: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "scheduler_node_name": node, **(host_vars or {}).get(host, {})}
             for host, node in HOSTS.items()}
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return path


def recording_bin(directory: Path) -> tuple[Path, Path]:
    """A bin dir whose scontrol, sinfo and squeue log every call (one JSON line: the tool and
    its argv) and exec the real one: a real count of what the service ran. While a file
    `<tool>.fault` exists in the dir (inject_fault), that tool prints its content and exits 0
    instead, changing nothing: a scheduler command that answers garbage."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "slurm.calls"
    log.touch()
    for tool in ("scontrol", "sinfo", "squeue"):
        wrapper = directory / tool
        wrapper.write_text(RECORDING.format(python=sys.executable, log=str(log), tool=tool,
                                            real=shutil.which(tool),
                                            fault=str(directory / f"{tool}.fault")))
        wrapper.chmod(0o755)
    return directory, log


def inject_fault(bin_dir: Path, tool: str, output: str | None) -> None:
    """From now on `tool` answers `output` with exit status 0 and does nothing; None: the
    real one again."""
    fault = bin_dir / f"{tool}.fault"
    if output is None:
        fault.unlink(missing_ok=True)
    else:
        fault.write_text(output)


def calls(log: Path) -> list[list[str]]:
    """Every Slurm command the service ran, in order: [tool, *argv]."""
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def timed_calls(log: Path) -> list[tuple[float, list[str]]]:
    """Every Slurm command the service ran with the time it started: (time, [tool, *argv])."""
    times = log.with_name(log.name + ".times")
    rows = [json.loads(line) for line in times.read_text().splitlines() if line] \
        if times.exists() else []
    return [(row[0], row[1:]) for row in rows]


def scontrol_calls(log: Path) -> list[list[str]]:
    return [c[1:] for c in calls(log) if c[0] == "scontrol"]


def drains(log: Path) -> list[list[str]]:
    return [c for c in scontrol_calls(log) if "State=DRAIN" in c]


def requeues(log: Path) -> list[list[str]]:
    return [c for c in scontrol_calls(log) if c[:1] == ["requeue"]]


def service_overrides(workdir: Path, cluster: SlurmCluster, pager: str, **rails: Any
                      ) -> tuple[dict[str, Any], Path]:
    bin_dir, log = recording_bin(workdir / "bin")
    overrides = {
        "ansible_inventory": str(write_inventory(workdir / "hosts.yml")),
        "pager_url": f"http://{pager}/page",
        "scheduler": {"kind": "slurm", "bin_dir": str(bin_dir), "slurm_conf": str(cluster.conf),
                      "command_timeout": "60s", **rails},
    }
    return overrides, log


def quarantine_book(name: str = "node_quarantine", alertnames: tuple[str, ...] = (
        "GpuLost", "GpuXidErrors"), **extra: Any) -> dict[str, Any]:
    return {"name": name, "match": {"alertname": list(alertnames)}, "target": ["node"],
            "steps": [{"action": "quarantine"}], **extra}


def submit(cluster: SlurmCluster, nodes: int = 2, *, exclude: str | None = None) -> str:
    """A requeueable batch job of `nodes` nodes that runs until cancelled."""
    argv = ["sbatch", "--parsable", "--requeue", f"--nodes={nodes}",
            f"--output={cluster.root}/job-%j.out"]
    if exclude:
        argv.append(f"--exclude={exclude}")
    out = cluster.run([*argv, "--wrap", "srun sleep 600"])
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def job_nodes(cluster: SlurmCluster, job_id: str) -> tuple[str, str]:
    """(state, node list) of a job, from squeue."""
    out = cluster.run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%T|%N"]).stdout
    state, _, nodes = out.strip().partition("|")
    return state, nodes
