"""Issue 26, acceptance 3: the client installs alone and a real job reports through it.

A fresh virtualenv (no system site-packages) gets the local CPU torch wheel and this checkout's
distribution with its `client` extra, offline: pip reads only the local sources this machine's
pip is configured with (find-links folders and file:// indexes), never a network index. Then:

- none of ansible-core, ansible-runner, flask, bcrypt, py-spy (nor the other server-side
  packages) is installed, and `pip check` is clean;
- a real 2-rank torchrun job (gloo) run with that virtualenv's Python, outside the checkout,
  imports the installed client and reports every step to a real training exporter (the
  stack's, from the project's own environment), which serves both ranks' steps.

On the code before issue 26 the install pulled all five (they were base dependencies).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.support.net import free_port, wait_until
from tests.support.procs import running
from tests.training.support import exporter
from trainwatch.exporters import DISTRIBUTION

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# what a training rank must not pull in (the list), and the other server-side parts
FORBIDDEN = {"ansible-core", "ansible-runner", "flask", "bcrypt", "py-spy"}
SERVER_SIDE = {"waitress", "prometheus-client", "nvidia-ml-py", "pyyaml", "requests",
               "werkzeug"}
STEPS = 30

JOB = """
import os, sys, torch, torch.distributed as dist
import trainwatch.exporters
from trainwatch.exporters.rank import TrainingMonitor
dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
tw = TrainingMonitor(optimizer=opt)
torch.manual_seed(dist.get_rank())
step = 1
while step <= int(sys.argv[1]):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    tw.report(step, loss=float(loss), samples=8)
    step = tw.step_end(step).next_step
tw.close()
# one write per line: two ranks share the log, and a pipe keeps a single small write whole
NODE_SIDE = ("trainwatch.exporters.node", "trainwatch.remediation")
sys.stdout.write(f"CLIENT_FROM {trainwatch.exporters.__file__}\\n"
                 f"NODE_SIDE_LOADED {[m for m in sys.modules if m.startswith(NODE_SIDE)]}\\n")
sys.stdout.flush()
# Both ranks leave together, as examples/train_ddp.py does: a rank that tears gloo down while
# its peer is still in it aborted once in CI ("terminate called without an active exception").
dist.barrier()
dist.destroy_process_group()
"""


def local_pip_sources() -> list[str]:
    """pip arguments naming only the local package sources pip is configured with here: its
    find-links folders and file:// indexes (the first as --index-url, so no network index is
    consulted). Fails when there are none: this test never reaches the network."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True, check=True).stdout
    indexes: list[str] = []
    links: list[str] = []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        values = shlex.split(value.strip().strip("'\""))
        if key.endswith(("index-url", "extra-index-url")):
            indexes += [v for v in values if v.startswith("file://")]
        elif key.endswith("find-links"):
            links += [v for v in values if not v.startswith(("http://", "https://"))]
    if not indexes and not links:
        pytest.fail("pip has no local package source (find-links or file:// index) configured")
    args = ["--index-url", indexes[0]] if indexes else ["--no-index"]
    for url in dict.fromkeys(indexes[1:]):
        args += ["--extra-index-url", url]
    for link in dict.fromkeys(links):
        args += ["--find-links", link]
    return args


def pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True,
                          timeout=900, check=False,
                          env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null",
                               "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_the_client_installs_alone_and_a_two_rank_job_reports_through_it(tmp_path: Path
                                                                          ) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout.
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", ".stack", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    sources = local_pip_sources()
    pip(python, "install", "-q", *sources, "torch==2.13.0+cpu")
    pip(python, "install", "-q", *sources, f"{source}[client]")

    listed = json.loads(pip(python, "list", "--format=json").stdout)
    installed = {row["name"].lower().replace("_", "-") for row in listed}
    assert DISTRIBUTION in installed
    assert not installed & FORBIDDEN, installed & FORBIDDEN
    assert not installed & SERVER_SIDE, installed & SERVER_SIDE
    pip(python, "check")
    typed = subprocess.run([str(python), "-c", "import trainwatch.exporters, pathlib; "
                            "print(pathlib.Path(trainwatch.exporters.__file__).with_name('py.typed').is_file())"],
                           capture_output=True, text=True, cwd=tmp_path, check=True)
    assert typed.stdout.strip() == "True"

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    script = job_dir / "job.py"
    script.write_text(JOB)
    with exporter(tmp_path, node="client-node") as exp:
        argv = [str(python), "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                str(script), str(STEPS)]
        env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
               **exp.job_env("client-alone")}
        with running(argv, tmp_path / "job.log", env=env, cwd=job_dir) as job:
            wait_until(lambda: exp.by_rank("training_step", "client-alone")
                       == {"0": STEPS, "1": STEPS} or not job.alive(),
                       timeout=240, what="both ranks' last step at the exporter")
            wait_until(lambda: not job.alive(), timeout=60, what="the job's exit")
            log = job.log_text()
            assert job.proc.returncode == 0, log[-3000:]
        assert exp.by_rank("training_step", "client-alone") == {"0": STEPS, "1": STEPS}, log
    loaded_from = [line.split()[1] for line in log.splitlines()
                   if line.startswith("CLIENT_FROM")]
    assert len(loaded_from) == 2, log[-3000:]
    assert all(path.startswith(str(env_dir)) for path in loaded_from), loaded_from
    # issue 27: a rank loads the rank-side library and the contract, nothing node-side
    assert [line for line in log.splitlines() if line.startswith("NODE_SIDE_LOADED")] == [
        "NODE_SIDE_LOADED []"] * 2, log[-3000:]
