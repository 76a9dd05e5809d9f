"""Run the loss-spike demo against a running stack and print what happened, when.

Used by the README's first command (against the stack Ansible deployed under `.stack/`) and by
the end-to-end test (against a stack it started on free ports), so the demo and the test
exercise the same path: a real 2-rank torchrun job -> training exporter -> Prometheus rule ->
Alertmanager -> remediation webhook -> control API -> both ranks apply the new LR in-band.

The timeline comes from three independent witnesses: the job's own JSON event lines (spike
injected, command applied with the step), Prometheus' alerts API (firing), and the remediation
service's audit API (webhook received, action done).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from trainwatch.exporters.contract.catalog import TOKEN_FILES  # noqa: E402 - after the repo is on the path
from trainwatch.exporters.contract.tokens import read_secret_file  # noqa: E402

ALERT = "TrainingLossSpike"
LOCAL_INVENTORY_VARS = REPO / "ansible" / "inventories" / "local" / "group_vars" / "all.yml"


@dataclass
class Endpoints:
    """Where the stack answers, and what a training job on this node needs in its env."""

    prometheus: str
    alertmanager: str
    training_exporter: str
    remediation: str
    remediation_token: str
    job_env: dict[str, str]


@dataclass
class DemoResult:
    """Everything the demo observed; the end-to-end test asserts on it."""

    job: str
    started: float
    job_events: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)
    alert_fired_at: float | None = None
    webhook_at: float | None = None
    intent: dict[str, Any] | None = None
    returncode: int | None = None

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.job_events if e.get("event") == name]

    def spike_time(self) -> float | None:
        spikes = self.events("spike_injected")
        return min(e["time"] for e in spikes) if spikes else None

    def lr_applied(self) -> dict[int, dict[str, Any]]:
        """First applied scale_lr command per rank."""
        out: dict[int, dict[str, Any]] = {}
        for e in self.events("command_applied"):
            if e.get("type") == "scale_lr" and e.get("status") == "applied":
                out.setdefault(int(e["rank"]), e)
        return out

    def spike_to_applied_seconds(self) -> float | None:
        applied = self.lr_applied()
        spike = self.spike_time()
        if spike is None or len(applied) < 2:
            return None
        return max(e["time"] for e in applied.values()) - spike


def torchrun_argv(script: Path, *args: str, nproc: int = 2, master_port: int = 29511
                  ) -> list[str]:
    """A real multi-rank job launched the way users launch it (torchrun, loopback rendezvous)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(master_port), str(script), *args]


def _read_events(stream: Any, result: DemoResult, lock: threading.Lock,
                 echo: Callable[[str], None] | None) -> None:
    for raw in stream:
        line = raw.decode(errors="replace").rstrip("\n")
        start = line.find("{")
        event = None
        if start >= 0:
            try:
                event = json.loads(line[start:])
            except ValueError:
                event = None
        if isinstance(event, dict) and "event" in event:
            with lock:
                result.job_events.append(event)
        elif echo and line.strip():
            echo(f"    job | {line}")


def _firing_spike_alert(prometheus: str, job: str) -> bool:
    body = requests.get(f"{prometheus}/api/v1/alerts", timeout=2).json()
    return any(a["labels"].get("alertname") == ALERT and a["state"] == "firing"
               and a["labels"].get("training_job") == job for a in body["data"]["alerts"])


def _spike_intent(remediation: str, token: str, job: str) -> dict[str, Any] | None:
    """The spike's remediation intent: the one that acted, else the first. Every rank's alert
    makes an intent; the service acts on one and cools the others down, and which one acts
    depends on which a worker takes first, not on the order they were created in."""
    body = requests.get(f"{remediation}/v1/actions", params={"limit": 50}, timeout=2,
                        headers={"Authorization": f"Bearer {token}"}).json()
    fired = [i for i in body["actions"] if i["alertname"] == ALERT and i.get("phase") == "fire"
             and i["labels"].get("training_job") == job]
    return min(fired, key=lambda i: (not i.get("acted"), i["id"])) if fired else None


def run_spike_demo(endpoints: Endpoints, *, job: str, spike_at: int = 300, steps: int = 600,
                   step_time: float = 0.1, nproc: int = 2, master_port: int = 29511,
                   timeout: float = 240.0, echo: Callable[[str], None] | None = print,
                   extra_args: list[str] | None = None) -> DemoResult:
    """Run the job with a spike, watch the stack react, return what was seen."""
    env = {**os.environ, **endpoints.job_env, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    args = ["--job", job, "--steps", str(steps), "--step-time", str(step_time),
            "--spike-at-step", str(spike_at), "--print-every", "50", *(extra_args or [])]
    argv = torchrun_argv(REPO / "examples" / "train_ddp.py", *args, nproc=nproc,
                         master_port=master_port)
    result = DemoResult(job=job, started=time.time())
    lock = threading.Lock()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            cwd=REPO, start_new_session=True)
    reader = threading.Thread(target=_read_events, args=(proc.stdout, result, lock, echo),
                              daemon=True)
    reader.start()

    def note(when: float, text: str) -> None:
        result.timeline.append((when, text))
        if echo:
            echo(f"  +{when - result.started:6.1f}s  {text}")

    seen_spike: set[int] = set()
    seen_applied: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with lock:
                events = list(result.job_events)
            for e in events:
                rank = int(e.get("rank", -1))
                if e["event"] == "spike_injected" and rank not in seen_spike:
                    seen_spike.add(rank)
                    note(e["time"], f"spike injected on rank {rank} at step {e['step']} "
                                    f"(LR raised to {e.get('lr'):.3g})")
                if (e["event"] == "command_applied" and e.get("type") == "scale_lr"
                        and e.get("status") == "applied" and rank not in seen_applied):
                    seen_applied.add(rank)
                    note(e["time"], f"new LR {e['lr']:.3g} applied on rank {rank} "
                                    f"at step {e['step']}")
            if seen_spike and result.alert_fired_at is None:
                try:
                    if _firing_spike_alert(endpoints.prometheus, job):
                        result.alert_fired_at = time.time()
                        note(result.alert_fired_at, f"alert {ALERT} firing in Prometheus")
                except (requests.RequestException, ValueError, KeyError):
                    pass
            if seen_spike and result.webhook_at is None:
                try:
                    intent = _spike_intent(endpoints.remediation, endpoints.remediation_token, job)
                except (requests.RequestException, ValueError, KeyError):
                    intent = None
                if intent:
                    result.webhook_at = float(intent["created_at"])
                    note(result.webhook_at, f"webhook received by remediation: playbook "
                                            f"{intent['playbook']} (intent {intent['id']})")
            if len(seen_applied) >= nproc:
                break
            if proc.poll() is not None and not reader.is_alive():
                break
            time.sleep(0.2)
        # Let the job finish on its own (it shows the loss coming back down); bounded wait.
        remaining = max(5.0, deadline - time.monotonic())
        try:
            proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        reader.join(timeout=10)
        result.returncode = proc.returncode
        try:
            result.intent = _spike_intent(endpoints.remediation, endpoints.remediation_token, job)
        except (requests.RequestException, ValueError, KeyError):
            result.intent = None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
    return result


def print_summary(result: DemoResult, endpoints: Endpoints, echo: Callable[[str], None] = print
                  ) -> bool:
    """Print the outcome and the URLs; True when both ranks applied the cut."""
    applied = result.lr_applied()
    delay = result.spike_to_applied_seconds()
    summaries = {int(e["rank"]): e for e in result.events("summary")}
    echo("")
    if delay is not None:
        steps = sorted({e["step"] for e in applied.values()})
        echo(f"Spike to new LR on every rank: {delay:.1f} s; ranks applied it at step(s) {steps}.")
    else:
        echo("The new LR was NOT applied on every rank: see the logs under the stack's log dir.")
    before = [e for e in result.events("step") if e["rank"] == 0]
    spike = result.spike_time()
    if before and spike is not None:
        calm = [e["loss"] for e in before if e["time"] < spike]
        peak = [e["loss"] for e in before if e["time"] >= spike]
        if calm and peak:
            echo(f"  rank 0 loss: {calm[-1]:.4g} before the spike, peak {max(peak):.4g} after it")
    for rank, summary in sorted(summaries.items()):
        echo(f"  rank {rank}: final loss {summary.get('final_loss'):.4g}, final LR "
             f"{summary.get('lr'):.3g}, dropped samples {summary.get('dropped', 0)}")
    if result.intent:
        echo(f"  remediation intent {result.intent['id']}: state {result.intent['state']}")
    echo("")
    echo(f"Prometheus:          {endpoints.prometheus}")
    echo(f"Alertmanager:        {endpoints.alertmanager}")
    echo(f"Training exporter:   {endpoints.training_exporter}/metrics")
    echo(f"Remediation service: {endpoints.remediation}/v1/actions "
         f"(bearer token: the stack's {TOKEN_FILES['webhook']})")
    return delay is not None


def _local_url(port_variable: str) -> str:
    """A service of the local deployment: the demo ports are the local inventory's."""
    port = yaml.safe_load(LOCAL_INVENTORY_VARS.read_text())[port_variable]
    return f"http://127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=Path, default=REPO / ".stack",
                        help="the local deployment's prefix (trainwatch_prefix)")
    parser.add_argument("--prometheus", default=_local_url("prometheus_port"))
    parser.add_argument("--alertmanager", default=_local_url("alertmanager_port"))
    parser.add_argument("--training-exporter", default=_local_url("training_exporter_port"))
    parser.add_argument("--remediation", default=_local_url("remediation_port"))
    parser.add_argument("--job", default=f"demo-{int(time.time())}")
    parser.add_argument("--spike-at-step", type=int, default=300)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--step-time", type=float, default=0.1)
    args = parser.parse_args(argv)
    webhook_token, control_token = (args.prefix / TOKEN_FILES[name]
                                    for name in ("webhook", "control"))
    for path in (webhook_token, control_token):
        if not path.is_file():
            parser.error(f"{path} not found: deploy the stack first "
                         "(bash scripts/demo.sh)")
    endpoints = Endpoints(
        prometheus=args.prometheus, alertmanager=args.alertmanager,
        training_exporter=args.training_exporter, remediation=args.remediation,
        remediation_token=read_secret_file(webhook_token),
        job_env={
            "TRAINWATCH_JOB": args.job,
            "TRAINWATCH_EXPORTER_SOCKET": str(args.prefix / "run" / "training.sock"),
        })
    print(f"Running job {args.job}: 2 ranks (torchrun, gloo), loss spike at step "
          f"{args.spike_at_step} of {args.steps}")
    result = run_spike_demo(endpoints, job=args.job, spike_at=args.spike_at_step,
                            steps=args.steps, step_time=args.step_time)
    ok = print_summary(result, endpoints)
    return 0 if ok and result.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
