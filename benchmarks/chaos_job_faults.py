"""The chaos soak's faults in the job's own data and disk (issue 41): nan, spike, log_disk.

benchmarks/chaos.py registers these kinds and hands each fault here. None of them stops the
job or names a node that should leave service: any drain is a wrong drain.

  nan       a non-finite loss on every rank at the step after the injector writes the job's
            fault file (examples/train_ddp.py --fault-file, through $TRAIN_DDP_FAULT_FILE):
            TrainingNonFiniteLoss -> checkpoint_rollback (rollback to the newest healthy
            checkpoint, skip 200 batches, halve the learning rate)
  spike     the learning rate set to 20x the job's --lr the same way (the loss sits at ~6x
            its baseline until something cuts it): TrainingLossSpike -> lr_reduction (halve)
  log_disk  the node's log disk (a small ext4 filesystem on a loop device, where the job
            writes its ECS logs, TRAINWATCH_LOG_DIR) filled past 95% with rotated logs older
            than 7 days: NodeDiskFilling (node_exporter's filesystem series, the profile's
            node rules) -> disk_cleanup (Ansible on the node: old logs under the
            inventory's allowlisted roots removed)

Why ext4 and not a tmpfs: the shipped NodeDiskFilling rule leaves out tmpfs (and other
memory filesystems) on purpose, so a full tmpfs never alerts; a loop-mounted ext4 image is
the smallest filesystem the shipped rule watches.

Per kind, from the fault (the fault file's write, the disk's fill):

  detected  -> the acting intent of the kind's playbook (its created_at)
  decided   -> the first change: the job's command_applied event of the playbook's command
               (nan: rollback, spike: scale_lr), or, for log_disk, the acting audit record
               (the cleanup done; its files are gone by then)
  healed    -> nan: the first step after the applied rollback with a finite loss on every
               printed rank; spike: the first step after the applied cut from which
               HEALED_STEPS steps in a row have a loss under SPIKE_RATIO x the median loss
               of the BASELINE_SECONDS before the fault; log_disk: the disk back under the
               rule's threshold (more than 10% free) and a step of the job since, in the
               incarnation it had at the fault. null: not healed.
  discarded nan: the work since the checkpoint the rollback restored (its save to the
            fault); spike, log_disk: 0, unless the job restarted meanwhile (then the work
            since the newest committed checkpoint before the fault)

A fault not healed within the rule path plus ACT_MARGIN_SECONDS (the playbooks' cooldowns see
to that for a second fault of a kind soon after the first) is recorded as a human action: the
on-call sends the playbook's command through the control API by hand (nan: a rollback, spike:
a cut of the learning rate), or removes the old logs (log_disk).

goodput_cost: nan, healed + discarded (the NaN steps and the rolled-back work); spike, healed
(its steps at the bad learning rate); log_disk, 0 unless the job restarted. Without a heal,
the time to the on-call's action stands for healed. job_hurt: nan and spike always (the
training itself is hit), log_disk where the job restarted.

The stack of benchmarks/recovery.py carries none of these playbooks, no node_exporter and
no node rules, so `prepare` (before the job is submitted) adds what the selected kinds need:
the playbooks (the service restarted on its store with them, with the training exporters'
control token, and with hosts_shim() as its HTTP proxy for the inventory host names, which
resolve nowhere on this one machine: a training command goes to `node-b:<port>`, the
Prometheus instance of that node's exporter, as on a real cluster through DNS), and for
log_disk the mount, a node_exporter labelled as the disk's node, its scrape job and the
node rules (Prometheus reloaded, SIGHUP), and the node's cleanup roots in the inventory.
Every mount it makes is unmounted on the way out (the soak's ExitStack), after the job.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import psutil
import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.recovery import _checkpoint_before, ready_to_fault  # noqa: E402
from tests.slurm.cluster import SlurmCluster  # noqa: E402
from tests.slurm.fixtures import HOSTS  # noqa: E402
from tests.slurm.test_heal_e2e import events, of  # noqa: E402
from tests.slurm.test_heal_hang import PROFILES as STACK_PROFILES  # noqa: E402
from tests.slurm.test_heal_hang import Stack  # noqa: E402
from tests.slurm.test_quarantine import NODE_HOST, running_on  # noqa: E402
from tests.support.net import free_port, wait_until  # noqa: E402
from tests.support.procs import ManagedProcess, answers  # noqa: E402


class Soak(Protocol):
    """What a fault here uses of chaos.py's Soak (a Protocol, not an import: chaos.py imports
    this module, and the import graph has no cycles, tests/packaging/test_imports.py)."""

    cluster: SlurmCluster
    mon: Stack
    root: Path
    stack: ExitStack
    job: str
    out: Path

    def drained(self) -> set[str]: ...

    def first_step_after(self, t: float, what: str) -> float: ...


Drains = Callable[[Any, float, set[str]], set[str]]  # chaos.drains_since
Returns = Callable[[Any, set[str]], tuple[list[str], list[str]]]  # chaos.return_nodes

# kind -> (the playbooks that heal it, its alert)
KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "nan": (("checkpoint_rollback",), "TrainingNonFiniteLoss"),
    "spike": (("lr_reduction",), "TrainingLossSpike"),
    "log_disk": (("disk_cleanup",), "NodeDiskFilling"),
}
COMMAND = {"nan": "rollback", "spike": "scale_lr"}  # the job's command that heals it
FAULT_FILE_ENV = "TRAIN_DDP_FAULT_FILE"  # examples/train_ddp.py's --fault-file default
PLAYBOOKS = REPO / "remediation" / "playbooks"
ACT_MARGIN_SECONDS = 120.0  # as chaos.py's: past the rule path, the playbook's time to act
SETTLE_SECONDS = 10.0  # the demo rule path of these alerts (for: 1-5 s, 1 s intervals)
BASELINE_SECONDS = 20.0  # TrainingLossSpike's baseline window
SPIKE_RATIO = 2.0  # the rule's: a loss more than 2x its baseline is a spike
HEALED_STEPS = 10  # steps in a row under the ratio: healed, not a lucky dip
DISK_BYTES = 16 << 20  # the log disk: small, so filling it is quick
DISK_ALERT_FREE = 0.10  # NodeDiskFilling: under 10% free
DISK_FILL_FREE = 0.04  # filled to this free fraction
OLD_LOG_AGE_DAYS = 10  # older than disk_cleanup's max_age_days (7): what it may remove
STEP_TIMEOUT_SECONDS = 300.0


@dataclass
class LogDisk:
    """The log_disk kind's filesystem: where it is mounted, the node it belongs to."""

    target: Path
    node: str


_DISKS: dict[Path, LogDisk] = {}  # soak root -> its log disk (prepare's)


def selected(kinds: list[str]) -> list[str]:
    return [k for k in kinds if k in KINDS]


class _Shim(BaseHTTPRequestHandler):
    """A forward proxy that sends a request for an inventory host (node-a..c) to 127.0.0.1,
    port kept; any other host is refused (502)."""

    def _forward(self) -> None:
        url = urlsplit(self.path)
        if url.hostname not in HOSTS or url.port is None:
            self.send_error(502, f"not an inventory host: {url.hostname}")
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in ("proxy-connection", "connection", "host")}
        conn = http.client.HTTPConnection("127.0.0.1", url.port, timeout=30)
        try:
            path = url.path + (f"?{url.query}" if url.query else "")
            conn.request(self.command, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except OSError as exc:
            self.send_error(502, f"{type(exc).__name__}")
            return
        finally:
            conn.close()
        self.send_response(resp.status)
        for key, value in resp.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _forward

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the service's own log says what it sent."""


@contextmanager
def hosts_shim() -> Iterator[str]:
    """A forward proxy (_Shim) on the loopback: its URL while it runs."""
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Shim)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="hosts-shim", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _restart_service(soak: Soak, books: list[str], proxy: str) -> None:
    """Every remediation replica stopped (SIGTERM) and started again on the shared store with
    `books` added to its playbooks, the exporters' control token and `proxy` for the inventory
    hosts: a replica without the books would claim an alert and find no playbook for it."""
    for index, service in enumerate(soak.mon.replicas or [soak.mon.service]):
        _restart_replica(soak, service, index, books, proxy)


def _restart_replica(soak: Soak, service: Any, index: int, books: list[str],
                     proxy: str) -> None:
    config = yaml.safe_load(service.config_path.read_text())
    for name in books:
        shutil.copy(PLAYBOOKS / f"{name}.yaml", Path(config["playbooks_dir"]) / f"{name}.yaml")
    config["training_exporter_token_file"] = str(soak.mon.token_file)
    service.config_path.write_text(yaml.safe_dump(config))
    path = str(service.config_path)
    proc = next(p for p in psutil.Process().children()
                if p.status() != psutil.STATUS_ZOMBIE and path in p.cmdline())
    argv, env, cwd = proc.cmdline(), proc.environ(), Path(proc.cwd())
    env.update(http_proxy=proxy, HTTP_PROXY=proxy, no_proxy="127.0.0.1,localhost",
               NO_PROXY="127.0.0.1,localhost")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    wait_until(lambda: not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE,
               timeout=30, interval=0.1, what="the remediation service stopped")
    log = soak.root / "service" / f"remediation-chaos-job-{index}.log"
    soak.stack.callback(ManagedProcess(argv, log, env=env, cwd=cwd).stop)
    wait_until(lambda: answers(f"{service.url}/readyz"), timeout=60,
               what="the remediation service back with the job books")


def _unmount(target: Path) -> None:
    """Unmount `target`, retrying while something still holds it (a rank's log file just
    after the job ended), lazily as a last resort: no mount is left behind."""
    def gone() -> bool:
        subprocess.run(["umount", str(target)], capture_output=True, check=False, timeout=30)
        return not os.path.ismount(target)
    try:
        wait_until(gone, timeout=30, interval=0.5, what=f"{target} unmounted")
    except TimeoutError:
        subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False,
                       timeout=30)


def _mount_log_disk(root: Path, stack: ExitStack) -> Path:
    """A DISK_BYTES ext4 filesystem (loop device) at root/logdisk; unmounted by `stack`."""
    image, target = root / "logdisk.img", root / "logdisk"
    target.mkdir()
    with image.open("wb") as f:
        f.truncate(DISK_BYTES)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True,
                   capture_output=True, timeout=60)
    subprocess.run(["mount", "-o", "loop", str(image), str(target)], check=True,
                   capture_output=True, timeout=60)
    stack.callback(_unmount, target)
    for sub in ("job", "rotated"):
        (target / sub).mkdir()
    return target


def _log_disk_stack(soak: Soak, target: Path, node: str) -> None:
    """node_exporter (filesystem only) as `node`'s, its scrape job and the profile's node
    rules in Prometheus (reloaded), and the node's cleanup roots in the inventory."""
    port = free_port()
    exporter = ManagedProcess(
        ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{port}",
         "--collector.disable-defaults", "--collector.filesystem"],
        soak.root / "node-exporter.log")
    soak.stack.callback(exporter.stop)
    wait_until(lambda: answers(f"http://127.0.0.1:{port}/metrics"), timeout=30,
               what="node_exporter up")
    prom_config = soak.root / "prometheus.yml"
    config = json.loads(prom_config.read_text())
    profile = next(name for name, p in STACK_PROFILES.items()
                   if str(p["rules"] / "training.yml") in config["rule_files"])
    config["rule_files"].append(str(STACK_PROFILES[profile]["rules"] / "node.yml"))
    config["scrape_configs"].append({"job_name": "node", "static_configs": [
        {"targets": [f"127.0.0.1:{port}"], "labels": {"instance": f"{NODE_HOST[node]}:{port}"}}]})
    prom_config.write_text(json.dumps(config))
    prom = next(p for p in psutil.Process().children()
                if p.status() != psutil.STATUS_ZOMBIE and p.name() == "prometheus")
    prom.send_signal(signal.SIGHUP)
    wait_until(lambda: _query(soak, f'node_filesystem_avail_bytes{{mountpoint="{target}"}}'),
               timeout=60, interval=0.5, what="Prometheus scraping the log disk")
    inventory = Path(yaml.safe_load(soak.mon.service.config_path.read_text())
                     ["ansible_inventory"])
    hosts = yaml.safe_load(inventory.read_text())
    hosts["all"]["hosts"][NODE_HOST[node]].update(
        trainwatch_cleanup_allowed_roots=[str(target)],
        trainwatch_cleanup_log_dirs=[str(target / "rotated"), str(target / "job")])
    inventory.write_text(yaml.safe_dump(hosts))


def _query(soak: Soak, expr: str) -> list[dict[str, Any]]:
    try:
        return requests.get(f"{soak.mon.prom}/api/v1/query", params={"query": expr},
                            timeout=10).json()["data"]["result"]
    except (requests.RequestException, ValueError, KeyError):
        return []


def prepare(soak: Soak, kinds: list[str]) -> None:
    """What the selected kinds need, before the job is submitted (module docstring)."""
    mine = selected(kinds)
    if not mine:
        return
    if {"nan", "spike"} & set(mine):  # the job's sbatch environment carries it (--export)
        os.environ[FAULT_FILE_ENV] = str(soak.root / "faults.json")
    if "log_disk" in mine:
        disk = _DISKS[soak.root] = LogDisk(_mount_log_disk(soak.root, soak.stack),
                                           soak.cluster.nodes[0])
        os.environ["TRAINWATCH_LOG_DIR"] = str(disk.target / "job")  # the ranks' ECS logs
        _log_disk_stack(soak, disk.target, disk.node)
    proxy = soak.stack.enter_context(hosts_shim())
    _restart_service(soak, sorted({b for k in mine for b in KINDS[k][0]}), proxy)


def _acted(soak: Soak, books: tuple[str, ...], since: float) -> dict[str, Any] | None:
    audit = soak.mon.service.actions()["audit"]
    return min((a for a in audit if a["playbook"] in books and a["decision"] == "acted"
                and a["at"] > since), key=lambda a: a["at"], default=None)


def _created(soak: Soak, intent_id: int) -> float:
    return float(next(i["created_at"] for i in soak.mon.service.actions()["actions"]
                      if i["id"] == intent_id))


def _applied(soak: Soak, command: str, since: float) -> dict[str, Any] | None:
    return next((e for e in of(events(soak.out), "command_applied")
                 if e["time"] > since and e["type"] == command and e["status"] == "applied"),
                None)


def _steps(soak: Soak, since: float) -> list[dict[str, Any]]:
    return sorted((e for e in of(events(soak.out), "step") if e["time"] > since),
                  key=lambda e: e["time"])


def _finite_after(soak: Soak, since: float) -> float | None:
    """The first step after `since` from which every printed step (each rank's) is finite."""
    steps = _steps(soak, since)
    for i, e in enumerate(steps):
        if all(_finite(s["loss"]) for s in steps[i:i + 2 * HEALED_STEPS]) \
                and len(steps) - i >= 2 * HEALED_STEPS:
            return e["time"]
    return None


def _rolled_back(soak: Soak, change: dict[str, Any], t_fault: float) -> dict[str, Any]:
    """restored_step and discarded (the restored checkpoint's save to the fault) of an
    applied rollback."""
    restored = (change.get("result") or {}).get("restored_step")
    saved = [e["time"] for e in of(events(soak.out), "checkpoint_saved")
             if e["step"] == restored and e["time"] <= t_fault]
    return {"restored_step": restored,
            "discarded": t_fault - (max(saved) if saved
                                    else _checkpoint_before(soak.out, t_fault))}


def _by_hand(soak: Soak, job: str, kind: str, why: str
             ) -> tuple[str, dict[str, Any] | None]:
    """What the on-call does when the playbook did not heal nan or spike (its cooldown, a
    failure): the playbook's command through every job node's control API by hand (a
    rollback, or a cut of the learning rate), waited for until applied: what they did, and
    the job's command_applied event (None: it was not applied)."""
    command: dict[str, Any] = (
        {"type": "rollback", "args": {"skip_batches": 200}} if kind == "nan"
        else {"type": "scale_lr", "args": {"factor": 0.5, "floor": 1.0e-6}})
    command["id"] = f"on-call-{kind}-{int(time.time() * 1000)}"
    token = soak.mon.token_file.read_text().strip()
    t = time.time()
    for node in running_on(soak.cluster, soak.job):
        exporter = soak.mon.exporters[node]
        resp = requests.post(f"{exporter.url}/v1/jobs/{job}/commands", json=command,
                             headers={"Authorization": f"Bearer {token}"}, timeout=10)
        if resp.status_code not in (200, 202):
            return (f"could not send {command['type']} by hand ({resp.status_code}; {why})",
                    None)
    try:
        change = wait_until(lambda: _applied(soak, command["type"], t),
                            timeout=STEP_TIMEOUT_SECONDS, interval=0.5,
                            what=f"{command['type']} by hand applied")
    except TimeoutError as exc:
        return f"sent {command['type']} by hand, not applied: {exc} ({why})", None
    return f"sent {command['type']} by hand through the control API ({why})", change


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and value == value and abs(value) != float("inf")


def _back_under(soak: Soak, since: float, limit: float) -> float | None:
    """The first step after `since` from which HEALED_STEPS steps in a row (both ranks'
    printed steps: 2 x HEALED_STEPS lines) have a finite loss under `limit`."""
    steps = _steps(soak, since)
    run = 2 * HEALED_STEPS
    for i in range(len(steps) - run + 1):
        if all(_finite(s["loss"]) and s["loss"] < limit for s in steps[i:i + run]):
            return steps[i]["time"]
    return None


def _write_fault(soak: Soak, kind: str, fault_id: str) -> float:
    """Write the job's fault file (atomically: a rank never reads half of it); its time."""
    path = Path(os.environ[FAULT_FILE_ENV])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"id": fault_id, "kind": kind}))
    t_fault = time.time()
    os.replace(tmp, path)
    return t_fault


def _fill(target: Path) -> int:
    """Fill the log disk to DISK_FILL_FREE with rotated logs OLD_LOG_AGE_DAYS old; bytes."""
    usage = shutil.disk_usage(target)
    want = usage.free - int(usage.total * DISK_FILL_FREE)
    old = time.time() - OLD_LOG_AGE_DAYS * 86400
    written, index = 0, 0
    while written < want:
        chunk = min(1 << 20, want - written)
        path = target / "rotated" / f"train-{index:03d}.log.gz"
        path.write_bytes(b"\0" * chunk)
        os.utime(path, (old, old))
        written, index = written + chunk, index + 1
    return written


def _disk_free(target: Path) -> float:
    usage = shutil.disk_usage(target)
    return usage.free / usage.total


def run(kind: str, soak: Soak, job: str, drains_since: Drains, return_nodes: Returns
        ) -> dict[str, Any]:
    """One fault of `kind` on the soak's job (training_job `job`), measured (module
    docstring), then the window of its rule path watched for drains (`drains_since`) and any
    drained node given back (`return_nodes`): the row chaos.py prints."""
    before = soak.drained()
    ready_to_fault(soak.cluster, soak.job, soak.out, name=job)
    disk = _DISKS.get(soak.root)
    incarnations = len(of(events(soak.out), "incarnation"))
    books, _ = KINDS[kind]
    t_fault = time.time()
    row: dict[str, Any] = {"kind": kind, "node": None, "t_fault": t_fault, "detected": None,
                           "decided": None, "healed": None, "discarded": 0.0}
    human: list[str] = []
    deadline = SETTLE_SECONDS + ACT_MARGIN_SECONDS
    t_human = 0.0  # when the on-call's action took effect, where one was needed
    if kind in ("nan", "spike"):
        baseline = [e["loss"] for e in of(events(soak.out), "step")
                    if t_fault - BASELINE_SECONDS <= e["time"] <= t_fault and _finite(e["loss"])]
        t_fault = row["t_fault"] = _write_fault(soak, kind, f"{kind}-{int(t_fault * 1000)}")
    else:
        assert disk is not None, "prepare() mounts the log disk"
        row["node"] = disk.node
        row["filled_bytes"] = _fill(disk.target)
        t_fault = row["t_fault"] = time.time()
    try:
        acted = wait_until(lambda: _acted(soak, books, t_fault), timeout=deadline,
                           interval=0.5, what=f"{books[0]} acted")
        row["detected"] = _created(soak, acted["intent_id"]) - t_fault
        if kind == "log_disk":
            row["decided"] = acted["at"] - t_fault
            t_healed = wait_until(lambda: _disk_free(disk.target) > DISK_ALERT_FREE or None,
                                  timeout=STEP_TIMEOUT_SECONDS, interval=0.5,
                                  what="the log disk cleaned")
            first = soak.first_step_after(max(t_healed, acted["at"]),
                                          "a step after the cleanup")
            row["healed"] = first - t_fault
        else:
            change = wait_until(lambda: _applied(soak, COMMAND[kind], t_fault),
                                timeout=STEP_TIMEOUT_SECONDS, interval=0.5,
                                what=f"{COMMAND[kind]} applied")
            row["decided"] = change["time"] - t_fault
            if kind == "nan":
                first = wait_until(lambda: _finite_after(soak, change["time"]),
                                   timeout=STEP_TIMEOUT_SECONDS, interval=0.5,
                                   what="finite steps after the rollback")
                row.update(_rolled_back(soak, change, t_fault))
            else:
                limit = SPIKE_RATIO * statistics.median(baseline) if baseline else float("inf")
                first = wait_until(lambda: _back_under(soak, change["time"], limit),
                                   timeout=STEP_TIMEOUT_SECONDS, interval=0.5,
                                   what="the loss back under the spike threshold")
                row["loss_limit"] = limit
            row["healed"] = first - t_fault
    except TimeoutError as exc:
        t_human = time.time()
        if kind in COMMAND:
            action, change = _by_hand(soak, job, kind, str(exc))
            t_human = change["time"] if change else time.time()
            if change and kind == "nan":
                row.update(_rolled_back(soak, change, t_fault))
        else:
            assert disk is not None
            for path in (disk.target / "rotated").iterdir():
                path.unlink()
            action = f"removed the old logs by hand ({exc})"
        human.append(action)
    time.sleep(max(0.0, t_fault + SETTLE_SECONDS + 5.0 - time.time()))
    restarts = [e["time"] for e in of(events(soak.out), "incarnation")][incarnations:]
    if restarts and kind != "nan":  # the job restarted: the work since the checkpoint is lost
        row["discarded"] = t_fault - _checkpoint_before(soak.out, t_fault)
    # what the job lost: nan, the NaN steps and the rolled-back work; spike, its steps at the
    # bad learning rate; log_disk, nothing unless the job restarted (its logs were dropped)
    lost = row["healed"] if row["healed"] is not None else t_human - t_fault
    cost = lost + row["discarded"] if kind in COMMAND or restarts else 0.0
    drained = drains_since(soak, t_fault, before)
    returned, by_hand = return_nodes(soak, drained | soak.drained())
    return {**row, "goodput_cost": cost, "job_hurt": kind in COMMAND or bool(restarts),
            "drained": sorted(drained), "wrong_drains": sorted(drained), "returned": returned,
            "human_action": "; ".join(human + by_hand) or None}

