"""Two job-stopping kinds of the chaos soak (benchmarks/chaos.py, issue 41) whose fault is in
the infrastructure: a remediation replica lost while the other takes over, and a peer's gloo
socket cut. chaos.py measures both as it measures `kill` (job_restart must requeue the job;
no node is named, so any drain is wrong); this module injects them and, after the fault's
rule alerts have had their time, says what only these kinds can say.

  replica     the stack runs two remediation replicas on one PostgreSQL store, Alertmanager
              sending every alert to both (the deployed HA setup: bench_stack(replicas=2)).
              One of them (alternately the first and the second) is killed (-9, its process
              group), then the rank on the job's second node is SIGKILLed (`kill`): the
              survivor alone must heal it, exactly once. The killed replica stays down until
              the fault has been measured (healed or handed to the on-call), then is started
              again with the same command line, environment and folder: its supervisor
              (systemd Restart=always, RestartSec=2 in the deployed unit) would have it back
              in seconds, which would let the old replica take part in the heal; held down,
              the run measures the case a failover exists for (a replica's host lost) and
              the next fault finds two replicas again. Exactly once: one acting job_restart
              record that requeued the job since the fault, one `scontrol requeue` by the
              service, one new incarnation of the job, and the restarted replica adds no act
              (Alertmanager's deliveries it missed, redelivered to it once it is back, are
              deduplicated in the shared store).
  socket_cut  the gloo TCP connection between the job's two ranks aborted on the second
              node's side with `ss -K` (the kernel's SOCK_DESTROY: the owner's next read
              fails with ECONNABORTED, the peer's with ECONNRESET). Which connection: the
              rank's ESTABLISHED TCP sockets (psutil) whose remote endpoint is a local
              endpoint of the peer rank's process, less any to or from the process group's
              TCPStore port (MASTER_PORT in the rank's environment; torchrun's agent hosts
              that store, so its connections go to the agent's pid, not the peer's, anyway).
              The exporter connection is a unix socket (TRAINWATCH_EXPORTER_SOCKET), never a
              TCP one. Both ranks' collective then fails at once (seen: "Read error ...
              Software caused connection abort" on the cut side, "Connection reset by peer"
              on the other), they exit, torchrun and srun end the job and job_restart
              requeues it: no hang, so the stall playbooks have nothing to do.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

import psutil

from benchmarks.recovery import SETTLE_MARGIN_SECONDS, _acts, _requeued, own_ranks
from benchmarks.recovery import inject as rank_inject
from tests.remediation.processes import RunningService
from tests.slurm.cluster import SlurmCluster
from tests.slurm.fixtures import timed_calls
from tests.slurm.test_heal_e2e import events, of
from tests.slurm.test_heal_hang import Stack
from tests.slurm.test_quarantine import running_on
from tests.support.net import wait_until
from tests.support.procs import ManagedProcess, answers
from trainwatch.exporters.node.tools.stack_dump import rank_processes

# kind -> (the playbooks that may heal it, its alert), as chaos.JOB_KINDS: both end the job
KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "replica": (("job_restart",), "TrainingJobVanished"),
    "socket_cut": (("job_restart",), "TrainingJobVanished")}
REPLICAS = 2  # what bench_stack starts for the soak: the deployed pair
SS = "/usr/bin/ss"  # iproute2's; -K needs CAP_NET_ADMIN and CONFIG_INET_DIAG_DESTROY
GONE_SECONDS = 30.0  # a killed process is gone within this


class Soak(Protocol):
    """What these faults use of chaos.py's Soak (named here, not imported: chaos.py imports
    this module, and an import back would close a cycle, tests/packaging/test_imports.py)."""

    cluster: SlurmCluster
    mon: Stack
    scenarios: dict[str, Path]
    stack: ExitStack
    job: str
    out: Path
    infra: dict[str, Any]  # what a fault keeps from inject() to settle()

    def settle_seconds(self, kind: str) -> float: ...


def inject(kind: str, soak: Soak, bad: str, procs: list[dict[str, Any]]) -> float:
    """Inject `kind` (KINDS) against the job, whose rank on node `bad` is `procs[0]`; the
    moment the job-stopping part was done (the rank's kill, the socket's abort)."""
    if kind == "replica":
        _kill_replica(soak)
        return rank_inject("kill", bad, procs, soak.scenarios)
    if kind == "socket_cut":
        return _cut_socket(soak, bad, procs[0]["pid"])
    raise ValueError(kind)


def settle(kind: str, soak: Soak, t_fault: float) -> dict[str, Any]:
    """After the fault was measured and its rule alerts had their time: the fields only this
    kind reports (socket_cut: the connection cut; replica: which was killed, when it was back
    and whether the heal was exactly once)."""
    state = soak.infra.pop(kind, {})
    if kind == "socket_cut":
        return {"cut": state.get("cut")}
    if kind != "replica":
        raise ValueError(kind)
    victim, survivor = state["victim"], state["survivor"]
    # dead from before the fault until now: whatever acted, the survivor did
    alone = not _replica_procs(victim)
    back = _restart_replica(soak, state)
    soak.mon.service = soak.mon.replicas[0]
    # the deliveries Alertmanager could not make to the killed replica reach it now: let one
    # arrive (a duplicate, deduplicated in the shared store) or the window pass
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: [a for a in soak.mon.service.actions()["audit"]
                            if a["at"] > back and a["decision"] == "deduplicated"],
                   timeout=soak.settle_seconds(kind) + SETTLE_MARGIN_SECONDS, interval=1.0,
                   what="a redelivery to the restarted replica")
    acts = [a for a in _acts(soak.mon, KINDS[kind][0], t_fault) if _requeued(a)]
    requeues = [t for t, call in timed_calls(soak.mon.log)
                if t > t_fault and call[:2] == ["scontrol", "requeue"]]
    incarnations = [e for e in of(events(soak.out), "incarnation") if e["time"] > t_fault]
    late = [a for a in acts if a["at"] > back]
    dedup = [a for a in soak.mon.service.actions()["audit"]
             if a["at"] > t_fault and a["decision"] == "deduplicated"]
    return {"replica_killed": victim.url, "survivor": survivor.url,
            "replica_killed_before_fault": round(t_fault - state["killed_at"], 2),
            "replica_back": round(back - t_fault, 2), "survivor_alone": alone,
            "requeuing_acts": len(acts), "requeues": len(requeues),
            "incarnations": len(incarnations), "acts_after_restart": len(late),
            "deduplicated": len(dedup),
            "exactly_once": alone and len(acts) == len(requeues) == len(incarnations) == 1
            and not late}


def _replica_procs(service: RunningService) -> list[psutil.Process]:
    """The live process(es) of one replica: this benchmark's children whose command line
    names its config (each replica has its own config file)."""
    config = str(service.config_path)
    found = []
    for proc in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and config in proc.cmdline():
                found.append(proc)
    return found


def _kill_replica(soak: Soak) -> None:
    """Kill (-9) one replica, alternately the first and the second, and read from the other
    meanwhile; what settle() needs to start it again goes into soak.infra."""
    replicas = soak.mon.replicas
    if len(replicas) < REPLICAS:
        raise RuntimeError(f"the stack runs {len(replicas)} remediation replica(s): "
                           f"bench_stack(replicas={REPLICAS}) is needed for a failover")
    kills = soak.infra.get("replica_kills", 0)
    soak.infra["replica_kills"] = kills + 1
    victim = replicas[kills % len(replicas)]
    survivor = next(r for r in replicas if r is not victim)
    procs = _replica_procs(victim)
    if len(procs) != 1:
        raise RuntimeError(f"expected one process of replica {victim.url}, found {len(procs)}")
    proc = procs[0]
    argv, env, cwd = proc.cmdline(), proc.environ(), Path(proc.cwd())  # before it is gone
    killed_at = time.time()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session (tests.support.procs)
    wait_until(lambda: not _replica_procs(victim), timeout=GONE_SECONDS, interval=0.1,
               what=f"replica {victim.url} gone")
    soak.mon.service = survivor
    soak.infra["replica"] = {"victim": victim, "survivor": survivor, "argv": argv, "env": env,
                             "cwd": cwd, "killed_at": killed_at}


def _restart_replica(soak: Soak, state: dict[str, Any]) -> float:
    """Start the killed replica again as its supervisor would (same command line,
    environment, folder; it is stopped with the run); when it answered /readyz."""
    victim: RunningService = state["victim"]
    log = victim.config_path.parent / "remediation-restarted.log"
    soak.stack.callback(ManagedProcess(state["argv"], log, env=state["env"],
                                       cwd=state["cwd"]).stop)
    wait_until(lambda: answers(f"{victim.url}/readyz"), timeout=60, interval=0.2,
               what=f"replica {victim.url} back")
    return time.time()


def _port(value: Any) -> int:
    """A TCP port from psutil, checked (it goes on ss's command line)."""
    port = int(value)
    if not 0 < port < 65536:
        raise ValueError(f"not a TCP port: {value!r}")
    return port


def gloo_connections(pid: int, peer_pid: int) -> list[tuple[int, int]]:
    """(local port, remote port) of every established TCP connection between rank process
    `pid` and rank process `peer_pid`, less those of the process group's TCPStore port
    (MASTER_PORT): the gloo pair(s) between the two ranks."""
    proc, peer = psutil.Process(pid), psutil.Process(peer_pid)
    store = {_port(proc.environ()[k]) for k in ("MASTER_PORT",) if k in proc.environ()}
    peer_ends = {(c.laddr.ip, c.laddr.port) for c in peer.net_connections(kind="tcp")
                 if c.laddr}
    return sorted({(_port(c.laddr.port), _port(c.raddr.port))
                   for c in proc.net_connections(kind="tcp")
                   if c.status == psutil.CONN_ESTABLISHED and c.raddr
                   and (c.raddr.ip, c.raddr.port) in peer_ends
                   and not {c.laddr.port, c.raddr.port} & store})


def _cut_socket(soak: Soak, bad: str, pid: int) -> float:
    """Abort the gloo connection(s) of rank `pid` (on node `bad`) to its peer on the job's
    other node with `ss -K`; when. soak.infra["socket_cut"] names what was cut."""
    job = psutil.Process(pid).environ()["TRAINWATCH_JOB"]  # the job script exports it
    good = next(n for n in running_on(soak.cluster, soak.job) if n != bad)
    peers = wait_until(lambda: own_ranks(rank_processes(job, good), soak.out), timeout=60,
                       what="the peer rank")
    pairs = gloo_connections(pid, peers[0]["pid"])
    if not pairs:
        raise RuntimeError(f"no TCP connection between rank pid {pid} and its peer "
                           f"pid {peers[0]['pid']}")
    t_fault = time.time()
    abort(pairs)
    soak.infra["socket_cut"] = {"cut": [f"{local}->{remote}" for local, remote in pairs]}
    return t_fault


def abort(pairs: list[tuple[int, int]]) -> None:
    """Abort each established TCP connection (local port, remote port) with `ss -K` (the
    kernel's SOCK_DESTROY): only the end whose source port is `local` matches, its owner's
    next read or write fails with ECONNABORTED and the peer gets a reset. RuntimeError when ss
    did not list it as killed (no CAP_NET_ADMIN, a kernel without INET_DIAG_DESTROY)."""
    for local, remote in pairs:
        local, remote = _port(local), _port(remote)
        done = subprocess.run([SS, "-K", "-t", "-n", "state", "established",
                               "sport", "=", f":{local}", "dport", "=", f":{remote}"],
                              capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0 or f":{local}" not in done.stdout:
            raise RuntimeError(f"ss -K did not abort {local}->{remote}: "
                               f"{done.returncode} {done.stderr.strip()[-300:]}")
