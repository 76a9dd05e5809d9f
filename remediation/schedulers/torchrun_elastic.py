"""torchrun elastic without a scheduler: quarantine a node by stopping its torchrun agent.

A job launched with `torchrun --nnodes=MIN:MAX --rdzv-backend=c10d` on each node keeps going
when one node's agent is gone: the other agents' workers fail their next collective, the
agents restart their worker group and re-rendezvous with the nodes that are left (at least
MIN), and the job resumes from its newest committed checkpoint, resharded to the smaller world
(trainwatch.exporters.rank.checkpoint, torch.distributed.checkpoint). So "drain" is: stop the agent
on exactly that inventory host (the `stop_training_agent` Ansible playbook runs this module's
`stop` there); there is nothing to requeue and nothing to resume (the node rejoins when an
agent is started on it again, by a person, after its health check).

On the host: `python -m trainwatch.remediation.schedulers.torchrun_elastic stop [--job J]
[--exporter-socket S] --json` stops (SIGTERM, then SIGKILL after a grace period) every
torchrun agent of this host, or of job J, whose ranks report to this host's training exporter
(its socket: several test "hosts" share one machine in the loopback cluster). Processes are
found through /proc, never through a pattern given to a tool nor a word in a command line:
the ranks are the processes torchrun started (a worker's environment holds the agent's
private TORCHELASTIC_ERROR_FILE directory, trainwatch.exporters.contract.identity), and an
agent is exactly the parent of such a rank that is not a rank itself. A viewer whose argv
says `torchrun`, or `tail .../log/torchrun`, starts no rank and is never touched.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from trainwatch.exporters.contract.catalog import ENV_EXPORTER_SOCKET
from trainwatch.exporters.contract.identity import job_from_env, torchelastic_agent_dir
from trainwatch.remediation.schedulers.base import Job, NodeState

GRACE_SECONDS = 15.0
PLAYBOOK = "stop_training_agent.yml"


def _read(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def _environ(pid: int) -> dict[str, str]:
    return dict(item.decode(errors="replace").split("=", 1)
                for item in _read(pid, "environ").split(b"\0") if b"=" in item)


def _parent(pid: int) -> int | None:
    """The parent's pid from /proc/<pid>/stat (after the command name, which may hold
    spaces and parentheses: the last `)` ends it)."""
    fields = _read(pid, "stat").rsplit(b")", 1)[-1].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def _is_rank(env: dict[str, str]) -> bool:
    """Whether a process with this environment is a worker a torchrun agent started (or a
    child of one, which inherits it)."""
    return bool(torchelastic_agent_dir(env))


def find_agents(job: str | None, exporter_socket: str | None) -> list[dict[str, Any]]:
    """torchrun agents on this machine (of `job`, reporting to `exporter_socket`): the parents
    of the ranks that match, each once."""
    environs: dict[int, dict[str, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            environs[int(entry.name)] = _environ(int(entry.name))
    agents: dict[int, dict[str, Any]] = {}
    for pid, env in environs.items():
        if not _is_rank(env):
            continue
        if job is not None and job_from_env(env) != job:
            continue
        if exporter_socket is not None and env.get(ENV_EXPORTER_SOCKET) != exporter_socket:
            continue
        parent = _parent(pid)
        if parent is None or parent in agents or parent == os.getpid():
            continue
        parent_env = environs.get(parent)
        if parent_env is None or _is_rank(parent_env):
            continue  # a rank's own child (a data loader worker) or a parent already gone
        agents[parent] = {"pid": parent, "job": job_from_env(env), "rank_pid": pid}
    return list(agents.values())


def _alive(pid: int) -> bool:
    status = _read(pid, "stat").split(b")")[-1].split()
    return bool(status) and status[0] != b"Z"


def stop(job: str | None, exporter_socket: str | None, grace: float = GRACE_SECONDS
         ) -> dict[str, Any]:
    agents = find_agents(job, exporter_socket)
    for agent in agents:
        try:
            os.kill(agent["pid"], signal.SIGTERM)  # the agent stops its workers first
        except ProcessLookupError:
            agent["gone"] = True
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(a["pid"]) for a in agents):
        time.sleep(0.1)
    for agent in agents:
        if _alive(agent["pid"]):
            try:
                os.kill(agent["pid"], signal.SIGKILL)
                agent["killed"] = True
            except ProcessLookupError:
                pass
    return {"stopped": agents}


class TorchrunElasticScheduler:
    """The quarantine action's scheduler when jobs run under torchrun elastic alone."""

    def __init__(self, config: Any) -> None:
        self.config = config

    def node_states(self, nodes: tuple[str, ...]) -> dict[str, NodeState]:
        # No scheduler keeps node state: every node of the pool counts as in service; the
        # rails still count the quarantines of the window
        # (trainwatch.remediation.actions.quarantine).
        return {node: NodeState(node, "idle", "") for node in nodes}

    def jobs_on(self, node: str) -> list[Job]:
        return []  # the agents left re-rendezvous by themselves: nothing to requeue

    def drain(self, node: str, reason: str) -> dict[str, Any]:
        # imported here: the host-side `stop` command (this module's main) needs none of them
        import requests

        from trainwatch.remediation.actions import ansible as ansible_action
        from trainwatch.remediation.actions.base import ActionContext, ActionError
        from trainwatch.remediation.faults import NodeMap, check_plain_name
        from trainwatch.remediation.schedulers.base import SchedulerError

        nodes = NodeMap.from_inventory(self.config.ansible_inventory,
                                       ansible_action.state_dir(self.config))
        host = check_plain_name(nodes.host_of(node) or node, "host")
        ctx = ActionContext(config=self.config, labels={"node": host},
                            session=requests.Session(), idempotency_key=f"stop|{host}")
        try:
            result = ansible_action.run({"action": "ansible", "playbook": PLAYBOOK}, ctx)
        except ActionError as exc:
            raise SchedulerError(f"torchrun_elastic: stopping the agent on {host}: {exc}"
                                 ) from exc
        return {"node": host, "drained": True, "reason": reason,
                "agent_stopped": result.get("captured", {})}

    def requeue(self, job: Job) -> dict[str, Any]:
        return {"job": job.job_id, "requeued": False}

    def ended_jobs(self, node: str, job_id: str | None = None) -> list[Job]:
        return []  # the agents left continue in the allocation: no job ends

    def completing_jobs(self, node: str) -> list[Job]:
        return []

    def requeue_ended(self, job: Job) -> dict[str, Any]:
        return {"job": job.job_id, "requeued": False}

    def resume(self, node: str) -> dict[str, Any]:
        return {"node": node, "resumed": "start its agent again after the health check"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainwatch.remediation.schedulers.torchrun_elastic")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("stop", help="stop this host's torchrun agents")
    cmd.add_argument("--job", default=None)
    cmd.add_argument("--exporter-socket", default=None)
    cmd.add_argument("--grace", type=float, default=GRACE_SECONDS)
    cmd.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = stop(args.job, args.exporter_socket, args.grace)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
