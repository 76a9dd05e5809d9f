"""One command for a GPU host: the exporter against the real driver, end to end.

    bash scripts/gpu_check.sh [--steps 300] [--gpus N] [--json]

Needs only this project (its Python dependencies) and the host's PyTorch with CUDA; no
Prometheus. Runs, each on a free loopback port, with a summary at the end:
1. gpu-exporter (--interval 1) against the real NVML; `compare_nvidia_smi` against
   nvidia-smi, every field including memory.used and memory.reserved;
2. a training exporter and a short CUDA DDP job (examples/train_ddp.py under torchrun, NCCL,
   one rank per GPU up to --gpus), which must finish;
3. while it runs: the GPU exporter attributes the job's GPU memory to its training_job and
   ranks; GPM profiling series are present where the GPU supports them (Hopper and newer);
4. the training exporter's model FLOPs and peak give a non-zero MFU.
Exit 0 when every check passes (GPM counts as passed when the GPU says it has none).
Record the output in docs/gpu_exporter.md.

`--simulate` runs the same plumbing on a machine without a GPU (how the script itself is
tested): the fake NVML, whose simulated GPUs are given the job's real rank pids (the exporter
then reads their real /proc environ), the DDP job on CPU/gloo, and no nvidia-smi comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from trainwatch.exporters.contract import catalog as c  # noqa: E402
from trainwatch.exporters.node.gpu.gpm import GPM_NAMES  # noqa: E402

Series = list[tuple[str, dict[str, str], float]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(url: str) -> Series:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback
        text = response.read().decode()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text)
            for s in f.samples]


def wait_for(what: str, check: Callable[[], bool], timeout: float,
             proc: subprocess.Popen[bytes] | None = None) -> bool:
    """Poll `check` until it holds or `timeout` passes; give up at once when `proc`, the
    process that should make it hold, has exited (its log says why)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            print(f"  {what}: its process exited with code {proc.returncode}",
                  file=sys.stderr)
            return False
        time.sleep(0.5)
    print(f"  timed out waiting for {what}", file=sys.stderr)
    return False


class _StopChecks(Exception):
    """A service the remaining checks need did not start: skip them, report what ran."""


class Processes:
    """Every process this check starts, each in its own session, all stopped at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: the fake NVML re-reads the file whenever it changes."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def wait_rank_pids(job: str, ranks: int, timeout: float) -> list[int]:
    """Pids of the job's rank processes (RANK and TRAINWATCH_JOB in their environment),
    ordered by rank."""
    found: dict[int, int] = {}

    def scan() -> bool:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                env = dict(item.split(b"=", 1) for item in
                           (entry / "environ").read_bytes().split(b"\0") if b"=" in item)
            except OSError:
                continue
            if env.get(b"TRAINWATCH_JOB") == job.encode() and b"RANK" in env \
                    and b"LOCAL_RANK" in env:
                found[int(env[b"RANK"])] = int(entry.name)
        return len(found) >= ranks

    wait_for("the job's rank processes", scan, timeout)
    return [found[r] for r in sorted(found)]


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return len([line for line in out.splitlines() if line.strip()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--gpus", type=int, default=2, help="ranks of the DDP job (max)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON too")
    parser.add_argument("--simulate", action="store_true",
                        help="no GPU: fake NVML and a CPU job (tests the script itself)")
    args = parser.parse_args(argv)
    import torch

    if not args.simulate:
        if shutil.which("nvidia-smi") is None:
            print("gpu_check: nvidia-smi not found: this is not a GPU host", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("gpu_check: torch.cuda.is_available() is False", file=sys.stderr)
            return 2
    results: dict[str, Any] = {"torch": torch.__version__}
    if args.simulate:
        results.update(driver_gpus=args.gpus, device="simulated (fake NVML, CPU job)")
    else:
        results.update(driver_gpus=gpu_count(), device=torch.cuda.get_device_name(0))
    checks: dict[str, bool] = {}
    work = Path(tempfile.mkdtemp(prefix="trainwatch-gpu-check-"))
    procs = Processes(work)
    python = sys.executable
    scenario = work / "fake-nvml.json"
    exporter_env: dict[str, str] = {}
    if args.simulate:
        from trainwatch.exporters.node.gpu.fake_nvml import simulated_scenario
        from trainwatch.exporters.node.gpu.nvml_source import ENV_FAKE_NVML

        fake = simulated_scenario(args.gpus, dynamic=False)
        for gpu in fake["gpus"]:
            gpu["processes"] = []
        write_json(scenario, fake)
        exporter_env[ENV_FAKE_NVML] = str(scenario)
    try:
        gpu_port, train_port = free_port(), free_port()
        gpu_url = f"http://127.0.0.1:{gpu_port}/metrics"
        gpu_exporter = procs.start("gpu-exporter", [
            python, "-m",
            "trainwatch.exporters.node.gpu.cli", "--bind", "127.0.0.1", "--port", str(gpu_port),
            "--interval", "1"],
                    env=exporter_env)
        checks["gpu_exporter_up"] = wait_for("gpu-exporter", lambda: any(
            n == c.GPU_UP and v == 1 for n, _, v in scrape(gpu_url)), 60, gpu_exporter)
        time.sleep(3)  # a few cycles: GPM needs two
        if args.simulate:
            results["compare_nvidia_smi"] = "skipped (simulated: no nvidia-smi)"
        else:
            compare = subprocess.run([python, "-m",
                                      "trainwatch.exporters.node.gpu.compare_nvidia_smi",
                                      "--url", gpu_url, "--json"], capture_output=True,
                                     text=True, cwd=REPO, timeout=120)
            print(compare.stdout.rstrip())
            summary = json.loads(compare.stdout.splitlines()[-1]) if compare.stdout else {}
            results["compare_nvidia_smi"] = {k: summary.get(k) for k in
                                             ("compared", "mismatches", "gpus")}
            results["compare_diffs"] = [r for r in summary.get("results", []) if not r["ok"]]
            checks["nvidia_smi_agrees"] = compare.returncode == 0

        token = work / "token"
        token.write_text(secrets.token_hex(16))
        token.chmod(0o600)
        sock = work / "training.sock"
        train_url = f"http://127.0.0.1:{train_port}/metrics"
        training_exporter = procs.start("training-exporter", [
            python, "-m",
            "trainwatch.exporters.node.training.server", "--bind", "127.0.0.1", "--port",
            str(train_port), "--socket", str(sock), "--token-file", str(token),
            "--node", "gpu-check"])
        checks["training_exporter_up"] = wait_for("training exporter", sock.exists, 60,
                                                  training_exporter)
        if not checks["training_exporter_up"]:
            raise _StopChecks  # the job, attribution and FLOPs checks all read it
        job = f"gpu-check-{int(time.time())}"
        nproc = max(1, min(args.gpus, results["driver_gpus"]))
        env = {"TRAINWATCH_JOB": job, "TRAINWATCH_EXPORTER_SOCKET": str(sock),
               "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        ddp = procs.start("ddp-job", [
            python, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            str(REPO / "examples" / "train_ddp.py"), "--device",
            "cpu" if args.simulate else "cuda", "--steps",
            str(args.steps), "--step-time", "0.05"], env=env)
        results["ddp_ranks"] = nproc
        if args.simulate:  # the fake's GPUs run the job's real rank processes
            pids = wait_rank_pids(job, nproc, 60)
            fake["gpus"] = [{**gpu, "processes": [{"pid": pids[i], "used_memory": 2**30}]}
                            if i < len(pids) else gpu for i, gpu in enumerate(fake["gpus"])]
            write_json(scenario, fake)

        def attributed() -> bool:
            ranks = {lbl.get(c.LABEL_RANK) for n, lbl, v in scrape(gpu_url)
                     if n == c.GPU_PROCESS_MEMORY and lbl.get(c.LABEL_JOB) == job and v > 0}
            results["attributed_ranks"] = sorted(r for r in ranks if r)
            return len(results["attributed_ranks"]) == nproc

        checks["process_attribution"] = wait_for("attribution of the job's memory",
                                                 attributed, 120)
        series = scrape(gpu_url)
        supported = {lbl["gpu"]: v for n, lbl, v in series if n == c.GPU_GPM_SUPPORTED}
        gpm = {n: v for n, lbl, v in series if n in GPM_NAMES and lbl.get("gpu") == "0"}
        results["gpm_supported"] = supported
        results["gpm_gpu0"] = gpm
        results["gpm_cost_seconds"] = next((v for n, _, v in series
                                            if n == c.GPU_EXPORTER_GPM_DURATION), None)
        checks["gpm"] = (supported.get("0") == 0) or c.GPU_SM_ACTIVE in gpm
        results["utilization_gpu0"] = next((v for n, lbl, v in series if n == c.GPU_UTILIZATION
                                            and lbl.get("gpu") == "0"), None)

        def flops_seen() -> bool:
            got = {n: v for n, lbl, v in scrape(train_url) if lbl.get(c.LABEL_JOB) == job
                   and lbl.get(c.LABEL_RANK) == "0"}
            results["model_flops_total_rank0"] = got.get(c.TRAINING_MODEL_FLOPS)
            results["peak_flops_rank0"] = got.get(c.TRAINING_PEAK_FLOPS)
            return bool(got.get(c.TRAINING_MODEL_FLOPS))

        checks["mfu_series"] = wait_for("model FLOPs", flops_seen, 60)
        first = (time.monotonic(), results.get("model_flops_total_rank0") or 0.0)
        time.sleep(5)
        flops_seen()
        rate = ((results.get("model_flops_total_rank0") or 0.0) - first[1]) / (
            time.monotonic() - first[0])
        results["achieved_flops_per_second_rank0"] = rate
        peak = results.get("peak_flops_rank0")
        results["mfu_rank0"] = rate / peak if peak else None
        # a CPU job has no peak: FLOP/s only
        checks["mfu_series"] = checks["mfu_series"] and rate > 0 and (bool(peak)
                                                                      or args.simulate)
        try:
            checks["ddp_job_finished"] = ddp.wait(600) == 0
        except subprocess.TimeoutExpired:
            checks["ddp_job_finished"] = False
    except _StopChecks:
        pass
    finally:
        procs.stop_all()
    results["checks"] = checks
    results["logs"] = str(work)
    print()
    print("GPU check summary")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    for key in ("device", "compare_nvidia_smi", "attributed_ranks", "gpm_supported",
                "gpm_gpu0", "gpm_cost_seconds", "utilization_gpu0",
                "achieved_flops_per_second_rank0", "peak_flops_rank0", "mfu_rank0"):
        print(f"  {key}: {results.get(key)}")
    print(f"  logs: {work}")
    if args.json:
        print(json.dumps(results, default=str))
    return 0 if checks and all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
