"""exporters/node/training/senders.py: a sender's job from what the kernel keeps for it."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from trainwatch.exporters.node.training import peers
from trainwatch.exporters.node.training.senders import (
    ANCILLARY_BYTES,
    Identity,
    Resolver,
    pass_credentials,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_process(root: Path, pid: int, *, start: str, cgroup: str = "0::/user.slice\n",
                 environ: dict[str, str] | None = None) -> None:
    proc = root / str(pid)
    proc.mkdir(parents=True, exist_ok=True)
    fields = ["S"] + ["0"] * 18 + [start] + ["0"] * 10
    (proc / "stat").write_text(f"{pid} (python3 (x) y) " + " ".join(fields))
    (proc / "cgroup").write_text(cgroup)
    (proc / "environ").write_bytes(b"\0".join(f"{k}={v}".encode()
                                              for k, v in (environ or {}).items()))


def test_slurm_cgroup_beats_the_environment_and_the_uid_is_always_part(tmp_path: Path) -> None:
    fake_process(tmp_path, 10, start="100",
                 cgroup="0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
                 environ={"SLURM_JOB_ID": "1"})  # what the process says loses to its cgroup
    fake_process(tmp_path, 11, start="100", environ={"TORCHELASTIC_RUN_ID": "run-7"})
    fake_process(tmp_path, 12, start="100", environ={"TORCHELASTIC_RUN_ID": "none"})
    resolver = Resolver(tmp_path)
    assert resolver.sender(10, 1000, 1000).identity == Identity(1000, "slurm:4242")
    assert resolver.sender(11, 1000, 1000).identity == Identity(1000, "torchelastic:run-7")
    assert resolver.sender(12, 1001, 1001).identity == Identity(1001, "")
    assert resolver.sender(99, 1002, 1002).identity == Identity(1002, "")  # gone: uid only


def test_a_reused_pid_gets_its_new_job(tmp_path: Path) -> None:
    clock = Clock()
    resolver = Resolver(tmp_path, clock=clock)
    fake_process(tmp_path, 20, start="100", environ={"SLURM_JOB_ID": "1"})
    assert resolver.sender(20, 1000, 1000).identity.scope == "slurm:1"
    fake_process(tmp_path, 20, start="555", environ={"SLURM_JOB_ID": "2"})
    assert resolver.sender(20, 1001, 1001).identity == Identity(1001, "slurm:2")  # other uid
    clock.now = 10.0  # past the recheck: the same uid's reused pid is looked up again
    assert resolver.sender(20, 1000, 1000).identity == Identity(1000, "slurm:2")


def test_credentials_arrive_with_every_datagram(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    pass_credentials(receiver)
    receiver.bind(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.sendto(b"x", path)
    _data, ancillary, _flags, _addr = receiver.recvmsg(16, ANCILLARY_BYTES)
    receiver.close()
    found = Resolver().of_datagram(ancillary)
    assert found is not None and (found.pid, found.uid) == (os.getpid(), os.getuid())
    # one reading serves the rank watch too: the process itself, pid and start time
    assert found.process == peers.identify(os.getpid()) and found.process is not None


def test_a_sender_gone_after_sending_keeps_its_identity(tmp_path: Path) -> None:
    """Its datagrams still queued (its last word, read by the rank watch's drain) are its
    job's, not refused as the uid alone's; the rank watch is told it is gone (None)."""
    clock = Clock()
    resolver = Resolver(tmp_path, clock=clock)
    fake_process(tmp_path, 30, start="100", environ={"SLURM_JOB_ID": "7"})
    first = resolver.sender(30, 1000, 1000)
    assert first.process == peers.Process(30, 100)
    (tmp_path / "30" / "stat").unlink()  # the process ended
    clock.now = 10.0
    later = resolver.sender(30, 1000, 1000)
    assert later.identity == Identity(1000, "slurm:7")
    assert later.process == first.process  # the watch judges that very process gone
