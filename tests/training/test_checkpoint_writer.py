"""The writer process of asynchronous checkpoints (exporters/rank/checkpoint_writer.py),
real processes throughout: the files are those of DCP's own writer, a writer that dies during
a save makes that save fail (reported, not committed) and the next one works, and a training
process killed with SIGKILL leaves no writer behind."""

from __future__ import annotations

import array
import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import torch

from tests.support.net import wait_until
from trainwatch.exporters.rank.checkpoint import CheckpointManager, weights_digest
from trainwatch.exporters.rank.checkpoint_writer import shared_writer

ROOT = Path(__file__).resolve().parents[2]


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    return model, optimizer


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_process_and_thread_writers_write_the_same_checkpoint(tmp_path: Path) -> None:
    model, optimizer = _model()
    digest = weights_digest(model)
    names = {}
    for writer in ("process", "thread"):
        manager = CheckpointManager(tmp_path / writer, model, optimizer, writer=writer)
        names[writer] = manager.save(1, loss=0.5)
        manager.wait()
        manager.close()
        assert manager.failed_saves == 0, manager.last_failure
    sizes = {w: sorted((p.name, p.stat().st_size) for p in (tmp_path / w / n).iterdir()
                       if p.suffix == ".distcp") for w, n in names.items()}
    assert sizes["process"] == sizes["thread"] and sizes["process"]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    restorer = CheckpointManager(tmp_path / "process", model, optimizer, writer="process")
    restorer.rollback()
    assert weights_digest(model) == digest


def _unread_bytes(sock_fd: int) -> int:
    """Bytes this end sent that the peer has not read yet (Linux TIOCOUTQ on a Unix socket)."""
    out = array.array("i", [0])
    fcntl.ioctl(sock_fd, termios.TIOCOUTQ, out, True)
    return out[0]


def test_a_writer_killed_during_a_save_fails_that_save_and_the_next_one_works(
        tmp_path: Path, caplog) -> None:
    model, optimizer = _model()
    manager = CheckpointManager(tmp_path, model, optimizer)
    manager.save(1, loss=0.5)
    manager.wait()  # the writer is up
    writer = shared_writer()
    pid = writer.pid
    assert pid is not None and manager.failed_saves == 0
    os.kill(pid, signal.SIGSTOP)  # it cannot read the next request...
    try:
        manager.save(2, loss=0.5)
        # ...so once the request sits unread in its socket, the save is in flight there
        wait_until(lambda: writer._sock is not None and _unread_bytes(writer._sock.fileno()),
                   timeout=60, what="the save request reached the stopped writer")
    finally:
        os.kill(pid, signal.SIGKILL)
    manager.wait()
    assert manager.failed_saves == 1 and "writer" in (manager.last_failure or "")
    assert "not eligible for rollback" in caplog.text
    assert [e["step"] for e in manager.manifest()] == [1]
    manager.save(3, loss=0.5)  # a new writer process
    manager.wait()
    assert manager.failed_saves == 1, manager.last_failure
    assert [e["step"] for e in manager.manifest()] == [1, 3]
    assert writer.pid != pid


CHILD = """
import sys, time, torch
from trainwatch.exporters.rank.checkpoint import CheckpointManager
from trainwatch.exporters.rank.checkpoint_writer import shared_writer
model = torch.nn.Linear(8, 8)
manager = CheckpointManager(sys.argv[1], model, torch.optim.SGD(model.parameters(), lr=0.1))
manager.save(1, loss=0.5)
manager.wait()
print(shared_writer().pid, flush=True)
time.sleep(600)
"""


@pytest.mark.slow  # two interpreters importing torch: ~10 s quiet, 100 s at load 10
def test_a_training_process_killed_with_sigkill_leaves_no_writer_behind(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        writer_pid = int(proc.stdout.readline())
        assert _alive(writer_pid)
        manifest = json.loads((tmp_path / "manifest.json").read_text())
        assert [e["step"] for e in manifest["checkpoints"]] == [1]
    finally:
        proc.kill()
        proc.wait()
    wait_until(lambda: not _alive(writer_pid), timeout=60, what="the writer exited")


WARM_AT_START = """
import json, os, sys, torch
from trainwatch.exporters.rank.checkpoint import CheckpointManager
from trainwatch.exporters.rank.checkpoint_writer import shared_writer
model = torch.nn.Linear(4, 2)
manager = CheckpointManager(sys.argv[1], model, torch.optim.SGD(model.parameters(), lr=0.1))
writer = shared_writer()
print(json.dumps({"ready": writer._ready, "policy": os.sched_getscheduler(writer.pid),
                  "nice": os.getpriority(os.PRIO_PROCESS, writer.pid)}))
manager.close()
"""


def test_the_writer_is_warm_before_the_first_step_and_runs_at_idle_priority(
        tmp_path: Path) -> None:
    """Issue 28, point 9: the writer's start-up (importing torch: seconds of a core) must not
    overlap the first training steps, nor take a core from them. A fresh training process:
    when the manager's constructor returns, the writer has started, imported what it needs and
    said so, and it runs at the lowest priority (nice 19, or SCHED_IDLE). The priority is set
    before its imports: by the parent right after the process starts, and by the writer
    itself first thing."""
    done = subprocess.run([sys.executable, "-c", WARM_AT_START, str(tmp_path / "ckpt")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["ready"], "the constructor waited for the writer's start-up"
    assert seen["nice"] == 19 or seen["policy"] == getattr(os, "SCHED_IDLE", None), seen


def test_a_fresh_writer_is_at_idle_priority_while_it_starts() -> None:
    from trainwatch.exporters.rank.checkpoint_writer import WriterProcess, priority_of

    writer = WriterProcess()
    try:
        during = priority_of(writer.pid)  # it is importing torch now
        writer.ensure_ready()
        assert during == priority_of(writer.pid)
        assert during[0] == "SCHED_IDLE" or during[1] == 19, during
    finally:
        writer.close()
