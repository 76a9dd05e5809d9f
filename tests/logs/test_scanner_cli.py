"""trainwatch-logscan as users run it: one-shot JSON, bad input, and the exporter over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.net import free_port, wait_until
from tests.support.procs import running
from trainwatch.exporters.contract.catalog import LOG_EVENT_KINDS

SCRIPT = Path(sys.executable).with_name("trainwatch-logscan")
ARGV0 = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m",
                                               "trainwatch.exporters.node.logs.scanner_cli"]

LOG = """\
2026-11-21 10:30:25 INFO Step 1: loss=1.234, lr=1e-4, time=0.5s
2026-11-21 10:30:26 INFO step=2 loss=0.0nan_guard hang_check=1
2026-11-21 10:30:30 ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.
[rank1]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught \
collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, \
Timeout(ms)=600000) ran for 600081 milliseconds before timing out.
2026-11-21 10:30:31 WARNING Loss became nan at step 7
"""


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ARGV0, *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_once_json_prints_one_object_with_all_classes(tmp_path: Path) -> None:
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    first.write_text(LOG)
    second.write_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off "
                      "the bus.\n")
    result = run_cli("--once", "--json", str(first), str(second))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)  # exactly one JSON object, nothing else on stdout
    assert out["lines"] == 6
    assert set(out["counts"]) == set(LOG_EVENT_KINDS)
    assert {k: v for k, v in out["counts"].items() if v} == {
        "cuda_oom": 1, "nccl_timeout": 1, "nonfinite_loss": 1, "xid": 1}


def test_once_with_an_unreadable_file_fails_without_partial_counts(tmp_path: Path) -> None:
    good = tmp_path / "a.log"
    good.write_text(LOG)
    result = run_cli("--once", "--json", str(good), str(tmp_path / "missing.log"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "cannot read" in result.stderr and "missing.log" in result.stderr


def test_bad_flags_exit_nonzero_with_a_reason(tmp_path: Path) -> None:
    for args, reason in [
        (("--port", "99999", "x.log"), "port"),
        (("--job", "../etc", "x.log"), "job name"),
        (("--interval", "0", "x.log"), "interval"),
        (("--json", "x.log"), "--json only applies to --once"),
        (("--once",), "needs at least one FILE"),
        ((), "PATH_OR_GLOB"),
    ]:
        result = run_cli(*args)
        assert result.returncode == 2, args
        assert reason in result.stderr, (args, result.stderr)
    state = tmp_path / "state.json"
    state.write_text("[1, 2]")
    result = run_cli("--state-file", str(state), "--port", str(free_port()), str(tmp_path))
    assert result.returncode == 2 and "state" in result.stderr
    assert state.read_text() == "[1, 2]"  # a bad state file is never overwritten


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = requests.get(url, timeout=5).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def event(job: str, rank: str, kind: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("training_log_events_total",
            (("kind", kind), ("rank", rank), ("training_job", job)))


def test_exporter_serves_counters_and_resumes_after_restart(tmp_path: Path) -> None:
    job_dir = tmp_path / "logs" / "exp-job"
    job_dir.mkdir(parents=True)
    log = job_dir / "rank-0.jsonl"
    log.write_text(json.dumps({"message": "step 1 loss=1.0"}) + "\n")
    kernel = tmp_path / "kern.log"
    kernel.write_text("")
    state = tmp_path / "logscan.json"
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    argv = [*ARGV0, "--bind", "127.0.0.1", "--port", str(port), "--state-file", str(state),
            "--interval", "0.1", "--kernel-log-file", str(kernel),
            str(tmp_path / "logs" / "*" / "rank-*.jsonl*")]
    oom = json.dumps({"message": "step 2 failed", "labels": {"training_job": "exp-job",
                                                               "rank": "0"},
                      "error": {"type": "torch.OutOfMemoryError",
                                "message": "CUDA out of memory. Tried to allocate 2.00 GiB."}})
    with running(argv, tmp_path / "scan1.log", ready_url=url) as proc:
        # Series start at 0 as soon as the file is seen, so the first failure is an increase.
        wait_until(lambda: scrape(url).get(event("exp-job", "0", "cuda_oom")) == 0.0,
                   timeout=20, what="zero-initialised series")
        with log.open("a") as handle:
            handle.write(oom + "\n")
        with kernel.open("a") as handle:
            handle.write("[ 12.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has "
                         "fallen off the bus.\n")
        wait_until(lambda: scrape(url).get(event("exp-job", "0", "cuda_oom")) == 1.0,
                   timeout=20, what="OOM counted")
        samples = wait_until(lambda: (s := scrape(url)).get(
            ("training_log_xid_events_total", (("pci_bus_id", "0000:3b:00"), ("xid", "79"))))
            and s, timeout=20, what="Xid counted")
        assert samples[event("", "", "xid")] == 1.0
        assert samples[("trainwatch_logscan_lines_total", ())] >= 3
        assert proc.stop() == 0  # SIGTERM: clean exit
    saved = json.loads(state.read_text())
    assert any(entry["path"] == str(log) for entry in saved["files"].values())
    assert os.stat(state).st_mode & 0o077 == 0
    with running(argv, tmp_path / "scan2.log", ready_url=url):
        # Already-counted lines are not counted again after the restart ...
        wait_until(lambda: scrape(url).get(event("exp-job", "0", "cuda_oom")) == 0.0,
                   timeout=20, what="resumed scanner up")
        with log.open("a") as handle:
            handle.write(oom + "\n")
        # ... and new ones are.
        wait_until(lambda: scrape(url).get(event("exp-job", "0", "cuda_oom")) == 1.0,
                   timeout=20, what="new OOM counted after restart")
        assert scrape(url).get(event("", "", "xid")) is None


def test_once_reads_in_chunks_without_splitting_lines(monkeypatch, capsys,
                                                      tmp_path: Path) -> None:
    from trainwatch.exporters.node.logs import scanner_cli

    monkeypatch.setattr(scanner_cli, "_ONCE_CHUNK", 7)  # far shorter than a line
    log = tmp_path / "a.log"
    log.write_text(LOG + "2026-11-21 ERROR CUDA out of memory (no newline at end)")
    assert scanner_cli.run_once([str(log)], True, "") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lines"] == 6
    assert out["counts"]["cuda_oom"] == 2 and out["counts"]["nccl_timeout"] == 1
