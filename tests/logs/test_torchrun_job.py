"""A real 2-rank torchrun job (CPU, gloo) logs through the handler and fails; the scanner
finds the failure in torchrun's real output and in the ranks' ECS files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trainwatch.exporters.node.logs.follower import FileFollower
from trainwatch.exporters.node.logs.scanner import Scanner, Source

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("rank_script.py")


def test_two_rank_job_failure_is_classified_from_real_output(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRAINWATCH_JOB": "tr-job",
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
         "--nproc-per-node", "2", "--max-restarts", "0", str(SCRIPT), str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path, check=False)
    assert result.returncode != 0
    output = tmp_path / "torchrun.log"
    output.write_text(result.stdout + result.stderr)
    assert "ChildFailedError" in output.read_text()  # the real torchelastic text

    once = subprocess.run([sys.executable, "-m",
                           "trainwatch.exporters.node.logs.scanner_cli", "--once",
                           "--json", str(output)], capture_output=True, text=True,
                          timeout=60, env=env, check=False)
    assert once.returncode == 0, once.stderr
    counts = json.loads(once.stdout)["counts"]
    assert counts["elastic_child_failed"] == 1, output.read_text()[-4000:]
    assert counts["cuda_oom"] == 1, output.read_text()[-4000:]

    scanner = Scanner()
    follower = FileFollower([str(tmp_path / "logs" / "*" / "rank-*.jsonl*")], {})

    def sink(source: Source, text: str) -> None:
        scanner.feed(source, text)

    follower.poll(sink)
    follower.close()
    for rank in ("0", "1"):
        lines = (tmp_path / "logs" / "tr-job" / f"rank-{rank}.jsonl").read_text().splitlines()
        assert len(lines) == 20 + (rank == "1")  # flushed at exit, nothing lost
    assert {k: v for k, v in scanner.events().items() if v} == {
        ("tr-job", "1", "nonfinite_loss"): 1}
