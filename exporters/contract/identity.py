"""Which job and rank a process belongs to: the one place every part derives them.

The training client (trainwatch.exporters.contract.launcher), the logging handler and log scanner
(trainwatch.exporters.rank.logs, trainwatch.exporters.node.logs), the GPU exporter's process
attribution
(trainwatch.exporters.node.gpu.processes) and the
remediation tools all name a job by `job_from_env` and accept it only if it matches
JOB_NAME_PATTERN, so a job's training metrics, log files, GPU processes and remediation
targets carry the same name. Kept dependency-free (stdlib and trainwatch.exporters.contract.catalog
only): the
training client imports it on every rank.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping

from trainwatch.exporters.contract.catalog import ENV_JOB
from trainwatch.exporters.contract.catalog import JOB_NAME_PATTERN as _JOB_NAME_PATTERN

# A launch's incarnation id as datagrams carry it (hex of a uuid; empty: none).
INCARNATION_PATTERN = re.compile(r"^[0-9a-f]{0,32}$")

JOB_NAME_PATTERN = re.compile(_JOB_NAME_PATTERN)

# (rank, local rank, world size, restart count) variable names per launcher, in order of
# precedence: torchrun/torchelastic, Slurm, Open MPI (also what Horovod's mpirun sets).
LAUNCHERS: tuple[tuple[str, str, str, str | None], ...] = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_RESTART_COUNT"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", None),
)
RANK_VARIABLES = tuple(names[0] for names in LAUNCHERS)

# Where the training_job label comes from when not given: the first of these that is set.
# Launcher job ids: torchrun's rendezvous id, Slurm, Open MPI (4.x orte, 5.x PRRTE/PMIx).
JOB_ENV_VARIABLES = (ENV_JOB, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_orte_ess_jobid",
                     "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE")
# torchrun sets TORCHELASTIC_RUN_ID to "none" when no --rdzv-id is given: not a job name.
PLACEHOLDER_JOB_NAMES = frozenset({"none"})
# Prefix of a job id derived from the rendezvous endpoint (no launcher job id).
DERIVED_JOB_PREFIX = "tw-"
_JOB_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


def label_safe(value: str) -> str:
    """A launcher's id as a label-safe job name (e.g. PMIx's `prterun-host-1@1`)."""
    safe = "".join(ch if ch in _JOB_CHARS else "-" for ch in value)[:128]
    return safe if safe[:1].isalnum() else "j" + safe[:127]


def torchelastic_agent_dir(env: Mapping[str, str]) -> str:
    """The torchelastic agent's private directory of this launch ('' outside torchrun): the
    part of TORCHELASTIC_ERROR_FILE before `/attempt_<n>/`, the same for every rank and every
    restart of one launch on a node, and different for every other launch."""
    error_file = env.get("TORCHELASTIC_ERROR_FILE", "")
    return error_file.split("/attempt_", 1)[0] if "/attempt_" in error_file else ""


def derived_job(env: Mapping[str, str]) -> str | None:
    """A job id every rank of one launch derives alike, and no concurrent launch shares.

    Without a launcher job id, torchrun's static rendezvous still gives every worker the
    rendezvous endpoint (MASTER_ADDR:MASTER_PORT, a port only one live job can hold on its
    host) and TORCHELASTIC_ERROR_FILE, a path inside the agent's private temporary directory
    (`mkdtemp`, kept across restarts, so a restarted job keeps its id):
    `/tmp/torchelastic_XXXX/<run_id>_YYYY/attempt_<n>/<local_rank>/error.json`. That directory
    with the host name names one launch on a node (the c10d rendezvous gives every restart
    round a new MASTER_PORT, so the endpoint is used only without it; a loopback endpoint then
    takes the host name too, since every node has its own 127.0.0.1). On several nodes the
    agents' directories differ, so the training client makes rank 0's id the job's
    (trainwatch.exporters.rank.sync.Agreement); parts that only see the environment (log files,
    GPU process attribution) name a multi-node unnamed job per node: give such jobs a name
    (--rdzv-id, TRAINWATCH_JOB).
    """
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if not (addr and port):
        return None
    agent_dir = torchelastic_agent_dir(env)
    host = ""
    if agent_dir or addr in ("localhost", "::1") or addr.startswith("127."):
        host = socket.gethostname()
    import hashlib  # lazy: it loads OpenSSL's libcrypto (~3.6 MiB RSS), rarely needed here

    # The agent's directory already names one launch on this host; the c10d rendezvous hands
    # each restart round a new MASTER_PORT, so the endpoint only counts without it.
    launch = f"{agent_dir}|{host}" if agent_dir else f"{addr}:{port}|{host}"
    digest = hashlib.sha256(launch.encode()).hexdigest()
    return DERIVED_JOB_PREFIX + digest[:12]


def job_from_env(env: Mapping[str, str]) -> str | None:
    """The job's id from the launcher: an explicit name, the launcher's job id (placeholders
    skipped, made label-safe), else one derived from the rendezvous; None outside a launcher.
    """
    for name in JOB_ENV_VARIABLES:
        value = env.get(name, "")
        if value and value not in PLACEHOLDER_JOB_NAMES:
            return value if name == ENV_JOB else label_safe(value)
    return derived_job(env)


def is_job_name(value: object) -> bool:
    """Whether `value` is a job name: the whole string matches JOB_NAME_PATTERN (fullmatch:
    `$` alone would also accept a trailing newline)."""
    return isinstance(value, str) and JOB_NAME_PATTERN.fullmatch(value) is not None


def validate_job(job: str) -> str:
    """Refuse (ValueError) a job name that is not a safe label value and path component."""
    if not is_job_name(job):
        raise ValueError(f"job name {job!r} must match {JOB_NAME_PATTERN.pattern}")
    return job


def validate_rank(rank: int) -> int:
    """Refuse a rank that is not a non-negative integer."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank {rank!r} must be a non-negative integer")
    return rank


def detect_job(env: Mapping[str, str] | None = None) -> str:
    """The job name from the launcher environment, or "default"."""
    env = os.environ if env is None else env
    return job_from_env(env) or "default"


def detect_rank(env: Mapping[str, str] | None = None) -> int:
    """The global rank from torchrun, Slurm or Open MPI variables, or 0."""
    env = os.environ if env is None else env
    for name in RANK_VARIABLES:
        if name in env:
            try:
                return int(env[name])
            except ValueError as exc:
                raise ValueError(f"{name}={env[name]!r} is not an integer rank") from exc
    return 0
