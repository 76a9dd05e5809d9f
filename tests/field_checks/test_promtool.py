"""promtool on what Trainwatch ships: `check rules --lint=all --lint-fatal` on every generated
rule file (the PrometheusRule ones through their `spec`), and `check metrics` on a real scrape
of every Trainwatch exporter, each started as its role starts it on a free port: the GPU
exporter on the fake NVML (no GPU here, `--simulate`), the training exporter fed by a real
rank, the log scanner following a log with failures in it, and the remediation service.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests
import yaml

from tests.support.net import free_port, wait_until
from tests.support.procs import running
from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank.client import TrainingMonitor

REPO = Path(__file__).resolve().parents[2]
GENERATED = REPO / "alert_rules" / "generated"
VENV_BIN = Path(sys.executable).parent
RULE_FILES = sorted(GENERATED.glob("*/*.yml"))
OPERATOR_FILES = sorted(GENERATED.glob("*/*-prometheusrule.yaml"))
# Lines the log scanner counts (an OOM and an NCCL timeout), as a rank's handler writes them.
FAILING_LOG = (
    '{"@timestamp":"2026-01-01T00:00:00Z","log.level":"error","message":'
    '"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",'
    '"labels":{"training_job":"fieldcheck"}}\n'
    '{"@timestamp":"2026-01-01T00:00:01Z","log.level":"error","message":'
    '"[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, '
    'OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.",'
    '"labels":{"training_job":"fieldcheck"}}\n'
)


def promtool(real_binaries: dict[str, str], *args: str, stdin: str | None = None
             ) -> subprocess.CompletedProcess:
    return subprocess.run([real_binaries["promtool"], *args], input=stdin, capture_output=True,
                          text=True, timeout=120, check=False)


def test_every_generated_rule_file_is_found() -> None:
    assert len(RULE_FILES) >= 10 and OPERATOR_FILES


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: str(p.relative_to(GENERATED)))
def test_rule_file_passes_promtool_lint(real_binaries: dict[str, str], path: Path) -> None:
    proc = promtool(real_binaries, "check", "rules", "--lint=all", "--lint-fatal", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", OPERATOR_FILES, ids=lambda p: p.name)
def test_prometheusrule_spec_passes_promtool_lint(real_binaries: dict[str, str], path: Path,
                                                  tmp_path: Path) -> None:
    spec = tmp_path / "spec.yml"
    spec.write_text(yaml.safe_dump(yaml.safe_load(path.read_text())["spec"]))
    proc = promtool(real_binaries, "check", "rules", "--lint=all", "--lint-fatal", str(spec))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_lint_is_fatal_on_a_duplicate_rule(real_binaries: dict[str, str],
                                               tmp_path: Path) -> None:
    """The check has teeth: two rules recording one name with one label set fail it."""
    rule = {"record": "job:up:sum", "expr": "sum by (job) (up)"}
    path = tmp_path / "dup.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule, rule]}]}))
    proc = promtool(real_binaries, "check", "rules", "--lint=all", "--lint-fatal", str(path))
    assert proc.returncode == 3, proc.stdout + proc.stderr


def _script(name: str) -> str:
    return str(VENV_BIN / name)


def _secret(path: Path) -> Path:
    path.write_text(secrets.token_hex(16))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def exporters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Every Trainwatch exporter running, each with something to report; name -> /metrics."""
    work = tmp_path_factory.mktemp("exporters")
    ports = {name: free_port() for name in ("gpu", "training", "logscan", "remediation")}
    url = {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}
    control_token = _secret(work / "control.token")
    socket_path = work / "training.sock"
    logs = work / "logs"
    logs.mkdir()
    (logs / "rank0.jsonl").write_text(FAILING_LOG)
    remediation_config = work / "remediation.yml"
    remediation_config.write_text(yaml.safe_dump({
        "bind": "127.0.0.1", "port": ports["remediation"],
        "webhook_token_file": str(_secret(work / "webhook.token")),
        "store_path": str(work / "remediation.sqlite"),
        # never contacted for a scrape
        "prometheus_url": "http://127.0.0.1:1", "alertmanager_url": "http://127.0.0.1:1",
        "training_exporter_token_file": str(control_token)}))
    remediation_config.chmod(0o600)
    with ExitStack() as stack:
        stack.enter_context(running(
            [_script("gpu-exporter"), "--bind", "127.0.0.1", "--port", str(ports["gpu"]),
             "--interval", "1", "--simulate", "2"], work / "gpu.log", ready_url=url["gpu"]))
        stack.enter_context(running(
            [_script("training-exporter"), "--bind", "127.0.0.1", "--port",
             str(ports["training"]), "--socket", str(socket_path), "--token-file",
             str(control_token), "--node", "fieldcheck-node"],
            work / "training.log", ready_url=url["training"]))
        stack.enter_context(running(
            [_script("trainwatch-logscan"), "--bind", "127.0.0.1", "--port", str(ports["logscan"]),
             "--state-file", str(work / "logscan-state.json"), str(logs / "*.jsonl")],
            work / "logscan.log", ready_url=url["logscan"]))
        stack.enter_context(running(
            [_script("remediation-server"), "--config", str(remediation_config)],
            work / "remediation.log", ready_url=url["remediation"].replace("/metrics", "/healthz"),
            cwd=REPO))
        rank = TrainingMonitor(rank_info=RankInfo("fieldcheck", rank=0, local_rank=0,
                                                  world_size=1, restarts=0),
                               socket_path=str(socket_path), control=False, flush_interval=0.05)
        for step in range(1, 6):
            rank.report(step, loss=2.0 / step, lr=1e-3, samples=32, step_time=0.1)
        rank.close()
        wait_until(lambda: 'training_job="fieldcheck"' in requests.get(url["training"],
                                                                       timeout=5).text,
                   timeout=30, what="the rank's steps in the training exporter")
        wait_until(lambda: "fieldcheck" in requests.get(url["logscan"], timeout=5).text,
                   timeout=30, what="the log scanner counting the failing log")
        yield url


@pytest.mark.parametrize("name", ["gpu", "training", "logscan", "remediation"])
def test_exporter_scrape_passes_promtool_check_metrics(real_binaries: dict[str, str],
                                                       exporters: dict[str, str],
                                                       name: str) -> None:
    scrape = requests.get(exporters[name], timeout=10)
    assert scrape.status_code == 200
    proc = promtool(real_binaries, "check", "metrics", stdin=scrape.text)
    assert proc.returncode == 0, f"{name}:\n{proc.stdout}{proc.stderr}"
    assert not proc.stdout.strip() and not proc.stderr.strip(), proc.stdout + proc.stderr


def test_check_metrics_has_teeth(real_binaries: dict[str, str]) -> None:
    bad = "# HELP thing_count A counter without the _total suffix.\n# TYPE thing_count counter\n"
    bad += "thing_count 1\n"
    assert promtool(real_binaries, "check", "metrics", stdin=bad).returncode != 0
