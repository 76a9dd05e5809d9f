"""A real Slurm 22.05 cluster on one machine, under one directory, for tests.

munged with a key of its own, slurmctld, and one `slurmd -N <node>` per GPU node (each node its
own Port= in slurm.conf), all in the foreground under tests.support.procs, all listening on
127.0.0.1 on free ports, with every state, spool, pid and log file under `root`. Nothing of the
machine's own Slurm or munge (/etc/slurm, /run/munge) is read or touched: every client command
gets SLURM_CONF pointing at this cluster's file, and slurm.conf's AuthInfo names this munged's
socket.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.net import Abort, free_port, wait_until
from tests.support.procs import ManagedProcess

BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue",
            "sbatch", "srun")


@dataclass
class SlurmCluster:
    """A started cluster: its files, its nodes and the environment its clients need."""

    root: Path
    conf: Path
    nodes: tuple[str, ...]
    partition: str
    env: dict[str, str]
    _stack: ExitStack = field(default_factory=ExitStack, repr=False)
    _procs: list[ManagedProcess] = field(default_factory=list, repr=False)

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster (argv, no shell)."""
        return subprocess.run(list(argv), env={**os.environ, **self.env}, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def node_state(self, node: str) -> str:
        """sinfo's long state of one node, e.g. `idle`, `allocated`, `drained`."""
        out = self.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"])
        return out.stdout.strip()

    def node_reason(self, node: str) -> str:
        out = self.run(["sinfo", "-h", "-N", "-n", node, "-o", "%E"])
        return out.stdout.strip()

    def reset_nodes(self) -> None:
        """Every node back to service, every job cancelled: a clean cluster for the next test."""
        self.run(["scancel", "--full", "--partition", self.partition])
        wait_until(lambda: self.run(["squeue", "-h", "-o", "%i"]).stdout.strip() == "",
                   timeout=60, what="every job gone")
        for node in self.nodes:
            if self.node_state(node).rstrip("*") not in ("idle",):
                self.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        wait_until(lambda: all(self.node_state(n) == "idle" for n in self.nodes), timeout=60,
                   what="every node idle")

    def stop_controller(self) -> None:
        """Stop slurmctld (its saved state, the slurmd daemons and their jobs stay): the
        scheduler away, as in a restart or a failover."""
        ctld = next(p for p in self._procs if p.argv[0] == "slurmctld")
        ctld.stop()
        self._procs.remove(ctld)

    def start_controller(self, timeout: float = 60.0) -> None:
        """Start slurmctld again from its saved state; returns once it answers (its nodes may
        still read `unknown` for a few seconds, until each slurmd registers again)."""
        self._procs.append(ManagedProcess(
            ["slurmctld", "-D", "-i", "-f", str(self.conf)],
            self.root / "log" / "slurmctld.out", env=self.env))
        wait_until(lambda: self.run(["scontrol", "ping"]).stdout.count("UP") > 0,
                   timeout=timeout, what="slurmctld answering again")

    def logs(self) -> str:
        """The tail of every daemon's log, for a failure message."""
        return "\n".join(f"--- {path.name} ---\n{path.read_text(errors='replace')[-2500:]}"
                         for path in sorted((self.root / "log").glob("*.log")))

    def stop(self) -> None:
        """Cancel every job first: a job's steps run under slurmstepd, which outlives the
        daemons, so a job left running would keep its processes (and write into its
        folder while it is removed)."""
        try:
            self.run(["scancel", "--full", "--partition", self.partition])

            def gone() -> bool:
                listed = self.run(["squeue", "-h", "-o", "%i"])
                return listed.returncode == 0 and listed.stdout.strip() == ""

            wait_until(gone, timeout=30, what="every job gone before the daemons stop")
        except (OSError, TimeoutError, subprocess.SubprocessError) as exc:
            print(f"slurm test cluster: jobs not all gone at stop: {exc}", file=sys.stderr)
        for proc in reversed(self._procs):
            proc.stop()
        self._stack.close()


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def _conf(root: Path, socket: Path, ctld_port: int, node_ports: dict[str, int],
          partition: str) -> str:
    nodes = "\n".join(
        f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=1 "
        f"RealMemory=100 State=UNKNOWN" for name, port in node_ports.items())
    return f"""# written by tests/slurm/cluster.py for one test session
ClusterName=tw{uuid.uuid4().hex[:8]}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmctldParameters=enable_configless
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/linear
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=60
SlurmctldTimeout=60
InactiveLimit=0
MinJobAge=300
KillWait=5
JobRequeue=1
{nodes}
PartitionName={partition} Nodes={",".join(node_ports)} Default=YES MaxTime=INFINITE State=UP
"""


def start(root: Path, nodes: Sequence[str] = ("tw-gpu-01", "tw-gpu-02", "tw-gpu-03"),
          partition: str = "gpu", timeout: float = 90.0, *,
          node_conf: Mapping[str, Sequence[str]] | None = None,
          open_to_users: bool = False) -> SlurmCluster:
    """Start munged, slurmctld and one slurmd per node under `root`; wait until every node is
    idle. On any failure everything started so far is stopped and the logs are in the error.

    `node_conf`: slurm.conf lines of a node's own (its `TaskProlog=`, say), appended to that
    node's copy of the file (`slurm-<node>.conf`), which its slurmd reads, as each host of a
    site reads its own /etc/slurm/slurm.conf (slurmctld logs that the copies differ).
    `open_to_users`: other users may submit (the cluster's folder and munged's socket folder
    searchable by everyone; the key stays root's alone)."""
    for sub in ("munge", "state", "log", *(f"spool/{n}" for n in nodes)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "munge", 0o755 if open_to_users else 0o700)
    if open_to_users:
        root.chmod(0o755)  # the users reach the slurm.conf and munged's socket folder
    key = root / "munge" / "munge.key"
    socket = root / "munge" / "munge.socket"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    os.chmod(key, 0o600)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, socket, free_port(), {n: free_port() for n in nodes}, partition))
    node_confs = {}
    for node, lines in (node_conf or {}).items():
        node_confs[node] = root / f"slurm-{node}.conf"
        node_confs[node].write_text(conf.read_text() + "".join(f"{line}\n" for line in lines))
    env = {"SLURM_CONF": str(conf)}
    cluster = SlurmCluster(root=root, conf=conf, nodes=tuple(nodes), partition=partition,
                           env=env)
    procs = cluster._procs
    try:
        procs.append(ManagedProcess(
            ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={socket}",
             f"--pid-file={root / 'munge' / 'munged.pid'}",
             f"--log-file={root / 'log' / 'munged.log'}",
             f"--seed-file={root / 'munge' / 'munged.seed'}"],
            root / "log" / "munged.out"))
        wait_until(lambda: socket.exists(), timeout=timeout, what="munged socket")
        procs.append(ManagedProcess(["slurmctld", "-D", "-i", "-f", str(conf)],
                                    root / "log" / "slurmctld.out", env=env))

        def ctld_up() -> bool:
            for proc in procs:
                if not proc.alive():
                    raise Abort(f"{proc.argv[0]} exited:\n{proc.log_text()[-3000:]}")
            return cluster.run(["scontrol", "ping"]).stdout.count("UP") > 0

        wait_until(ctld_up, timeout=timeout, what="slurmctld answering")
        for node in nodes:
            procs.append(ManagedProcess(
                ["slurmd", "-D", "-N", node, "-f", str(node_confs.get(node, conf))],
                root / "log" / f"slurmd-{node}.out", env=env))

        def all_idle() -> bool:
            for proc in procs:
                if not proc.alive():
                    raise Abort(f"{proc.argv[0]} exited:\n{proc.log_text()[-3000:]}")
            return all(cluster.node_state(n) == "idle" for n in nodes)

        wait_until(all_idle, timeout=timeout, interval=0.5, what="every slurmd node idle")
    except BaseException as exc:
        detail = cluster.logs()
        cluster.stop()
        raise RuntimeError(f"the Slurm test cluster did not start: {exc}\n{detail}") from exc
    return cluster
