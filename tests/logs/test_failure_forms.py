"""Scanner tests for every failure message form read in PyTorch's, NCCL's and gloo's sources
(tests/logs/failure_forms.py says where each line comes from), and a real gloo job on this
machine whose collective-timeout text the scanner must count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.logs.failure_forms import FORMS, FailureForm
from tests.support.net import free_port
from trainwatch.exporters.node.logs.scanner import Scanner, Source

REPO = Path(__file__).resolve().parents[2]
SOURCE = Source(name="forms", job="forms-job", rank="0")

GLOO_JOB = """
import datetime, os, sys, time
import torch, torch.distributed as dist
rank, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=2))
if rank == 0:
    try:
        if mode == "barrier":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=2))
        else:
            dist.all_reduce(torch.ones(1))
    except Exception as exc:
        print(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}", flush=True)
else:
    time.sleep(6)  # never enters the collective rank 0 waits in
os._exit(0)
"""


def counted(text: str) -> set[str]:
    scanner = Scanner()
    scanner.feed(SOURCE, text if text.endswith("\n") else text + "\n")
    return {kind for kind, count in scanner.counts_by_kind().items() if count}


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.source[:60])
def test_every_source_form_is_counted_as_its_class(form: FailureForm) -> None:
    assert counted(form.line) == set(form.kinds), form.source


@pytest.mark.parametrize("form", [f for f in FORMS if f.kinds], ids=lambda f: f.source[:60])
def test_forms_are_counted_behind_torchrun_prefixes_and_in_ecs_lines(form: FailureForm) -> None:
    import json
    assert counted(f"[rank3]:{form.line}") == set(form.kinds)
    assert counted(json.dumps({"message": form.line, "log.level": "error"})) == set(form.kinds)


@pytest.mark.parametrize("mode", ["barrier", "allreduce"])
def test_a_real_gloo_collective_timeout_is_counted(tmp_path: Path, mode: str) -> None:
    """torch 2.13 on gloo: rank 1 never enters the collective; rank 0's error text (gloo's
    'Timed out waiting ...ms for recv operation', ProcessGroupGloo's 'failed to pass
    monitoredBarrier') must count as a collective timeout."""
    script = tmp_path / "gloo_job.py"
    script.write_text(GLOO_JOB)
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ranks = [subprocess.Popen([sys.executable, str(script), str(rank), port, mode],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env) for rank in (0, 1)]
    try:
        outputs = [proc.communicate(timeout=120)[0] for proc in ranks]
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = outputs[0]
    assert "operation to complete" in text or "monitoredBarrier" in text, text
    assert "nccl_timeout" in counted(text), text
