"""Issue 38, acceptance 1 and 2: a Slurm site as it is, with Trainwatch added from the built
collection alone.

The site, before the deploy: three hosts of the loopback-cluster kind (each its own 127.0.38.x
address and, for Trainwatch, its own prefix under one root): mon-01 runs the site's own
Prometheus and Alertmanager (Debian's binaries, the site's configs: one job, one receiver),
and every host its own node_exporter. A service user and group for Trainwatch and a training
user (throwaway, useradd) exist; the training user is in neither group.

The deploy, as a platform engineer makes it: the collection archive installed with
`ansible-galaxy collection install --offline` into a folder of its own, an inventory of the
test's own (no trainwatch_project_src, no trainwatch_repo_root), run from a folder outside the
checkout with no PYTHONPATH to it. `prometheus_mode`, `alertmanager_mode` and
`node_exporter_mode` are `existing`: the site's servers gain Trainwatch's scrape jobs, rules
and receiver (read back from their HTTP APIs) and no second Prometheus or Alertmanager runs.
The GPU nodes run Trainwatch's training exporter (the other components are switched off: the
virtualenv is the cost) from the wheel the collection carries (byte-identical on the host,
installed as an archive), and the training user joins the service group through
`training_exporter_job_users`. A second run changes nothing; a site job named like one of
Trainwatch's fails the prometheus role with the live file byte-identical.

Then the site's Slurm (tests/slurm/cluster.py: munged, slurmctld, `slurmd -N gpu-01/gpu-02`),
each node's slurm.conf naming, as `TaskProlog=`, the file the training_exporter role wrote on
that host. The training user submits with `sbatch` a small job per node whose script has no
Trainwatch setting (its environment at submission has none either): it reports steps through
TrainingMonitor and logs through AsyncEcsHandler(), both with no argument. Its steps are in
the site's Prometheus with the node's label, and its log file in the node's training log
directory. Everything started is stopped; the users are removed.

It took over, with their assertions, the deploy test of tests/ansible/test_collection_alone.py
(the collection deploys from its own wheel), tests/ansible/test_use_existing.py (the site
playbook beside the site's own monitoring) and tests/ansible/test_job_environment.py (the
client's, the role's and the docs' socket agree; the TaskProlog's output): gpu-02 keeps the
role's default socket, /run/trainwatch/training.sock, so the module is skipped where that
folder exists (a deployment of the machine's own).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from tests.ansible.runner import (
    REPO,
    SITE,
    VENV_BIN,
    PlaybookRun,
    ansible_env,
    built_collection,
    run_playbook,
)
from tests.ansible.test_local_deploy import processes_under
from tests.cluster.cluster import free_port_on, kill_what_is_left
from tests.slurm.cluster import SlurmCluster, missing_binaries
from tests.slurm.cluster import start as start_slurm
from tests.support.net import wait_until
from tests.support.procs import alertmanager, prometheus, running
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.rank.config import MonitorConfig

DEFAULT_SOCKET_DIR = Path(catalog.DEFAULT_EXPORTER_SOCKET).parent
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("setpriv") is None,
    reason="needs root, useradd and setpriv: a service user and a training user of their own"),
    pytest.mark.skipif(DEFAULT_SOCKET_DIR.exists(),
                       reason=f"{DEFAULT_SOCKET_DIR} exists: a deployment of this machine's own")]

MON = "mon-01"
GPUS = ("gpu-01", "gpu-02")
ADDRESS = {MON: "127.0.38.11", "gpu-01": "127.0.38.21", "gpu-02": "127.0.38.22"}
# The prometheus role alone, for the clash run (the site playbook's other plays cost CPU).
PROMETHEUS_ONLY = REPO / "tests" / "ansible" / "prometheus_existing.yml"
SITE_JOB = {"job_name": "site-own", "static_configs": [{"targets": []}]}
SITE_RECEIVER = "site-oncall"
SWITCHED_OFF = ("grafana", "filebeat", "elasticsearch", "logstash", "kibana", "gpu_exporter",
                "log_scanner", "remediation")
STEPS = 30
# The job script of a training user: nothing of Trainwatch in it, and the training code names
# no socket, no log directory, no job.
TRAIN = '''\
import json, logging, time
from trainwatch.exporters.rank import AsyncEcsHandler, TrainingMonitor

log = logging.getLogger("train")
log.setLevel(logging.INFO)
handler = AsyncEcsHandler()
log.addHandler(handler)
loss = 1.0
with TrainingMonitor() as monitor:
    for step in range(1, {steps} + 1):
        loss *= 0.9
        monitor.report(step, loss=loss, lr=0.1)
        monitor.step_end(step)
        log.info("step %d loss %.4f", step, loss)
        time.sleep(0.05)
handler.close()
print(json.dumps({{"event": "summary", "log": str(handler.path), **monitor.stats()}},
                 default=str), flush=True)
'''


@dataclass
class Users:
    """The service user and group Trainwatch's services run as, and a training user."""

    service: str
    trainer: str

    @classmethod
    def create(cls) -> Users:
        tag = secrets.token_hex(3)
        made = cls(service=f"tws{tag}", trainer=f"twt{tag}")
        subprocess.run(["groupadd", "-r", made.service], check=True)
        subprocess.run(["useradd", "-r", "-M", "-N", "-g", made.service, "-s",
                        "/usr/sbin/nologin", made.service], check=True)
        # primary group `users`, as a site's accounts are; not in the service group yet
        subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", made.trainer],
                       check=True)
        return made

    def groups_of_trainer(self) -> set[str]:
        return set(subprocess.run(["id", "-nG", self.trainer], capture_output=True, text=True,
                                  check=True).stdout.split())

    def uid_of_trainer(self) -> int:
        return int(subprocess.run(["id", "-u", self.trainer], capture_output=True, text=True,
                                  check=True).stdout)

    def remove(self) -> None:
        for name in (self.trainer, self.service):
            subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", self.service], check=False, capture_output=True)


@dataclass
class Site:
    """The site's own monitoring, running before the deploy."""

    prometheus_url: str
    alertmanager_url: str
    node_exporter_port: int
    prometheus_config: Path
    alertmanager_config: Path
    etc: Path


def site_prometheus_config(jobs: list[dict]) -> str:
    return "# the site's own comment\n" + yaml.safe_dump(
        {"global": {"scrape_interval": "2s", "evaluation_interval": "30s"},
         "scrape_configs": jobs}, sort_keys=False)


@contextlib.contextmanager
def site_monitoring(workdir: Path) -> Iterator[Site]:
    etc = workdir / "site-etc"
    etc.mkdir()
    prom_config = etc / "prometheus.yml"
    prom_config.write_text(site_prometheus_config([SITE_JOB]))
    am_config = etc / "alertmanager.yml"
    am_config.write_text(yaml.safe_dump({"route": {"receiver": SITE_RECEIVER},
                                         "receivers": [{"name": SITE_RECEIVER}]}))
    node_port = free_port_on(list(ADDRESS.values()))
    mon_ports = (free_port_on([ADDRESS[MON]]), free_port_on([ADDRESS[MON]]))
    with contextlib.ExitStack() as stack:
        for host, address in ADDRESS.items():
            stack.enter_context(running(
                ["prometheus-node-exporter", f"--web.listen-address={address}:{node_port}",
                 "--collector.disable-defaults", "--collector.loadavg"],
                workdir / f"node-exporter-{host}.log",
                ready_url=f"http://{address}:{node_port}/metrics"))
        am_url = stack.enter_context(alertmanager(workdir, am_config, port=mon_ports[0],
                                                  address=ADDRESS[MON]))
        prom_url = stack.enter_context(prometheus(workdir, prom_config, port=mon_ports[1],
                                                  address=ADDRESS[MON]))
        yield Site(prom_url, am_url, node_port, prom_config, am_config, etc)


def site_inventory(path: Path, root: Path, site: Site, users: Users, port: int) -> Path:
    """The site's inventory: the monitoring host runs only the site's servers (nothing of
    Trainwatch's own there); the GPU nodes run Trainwatch's training exporter under a
    supervisord of their own, from the wheel the collection carries."""
    common = {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "ansible_pipelining": True,  # one process per task instead of a file each: less CPU
        "trainwatch_prefix": str(root) + "/{{ inventory_hostname }}",
        "trainwatch_service_user": users.service, "trainwatch_service_group": users.service,
        "trainwatch_create_service_user": False,
        "trainwatch_apt_update_cache": False,
        "trainwatch_install_packages": False,  # the site has them (python3-venv, supervisor)
        "trainwatch_generate_tokens": True,
        "trainwatch_bind_address": "{{ ansible_host }}",
        "trainwatch_scrape_address": "{{ ansible_host }}",
        **{f"{role}_enabled": False for role in SWITCHED_OFF},
        "node_exporter_mode": "existing",
        "node_exporter_port": site.node_exporter_port,
        "prometheus_mode": "existing",
        "prometheus_port": int(site.prometheus_url.rsplit(":", 1)[1]),
        "prometheus_existing_url": site.prometheus_url,
        "prometheus_existing_config": str(site.prometheus_config),
        "prometheus_existing_rules_dir": str(site.etc / "trainwatch" / "rules"),
        "prometheus_existing_targets_dir": str(site.etc / "trainwatch" / "targets"),
        "prometheus_existing_reload": "url",
        "alertmanager_mode": "existing",
        "alertmanager_port": int(site.alertmanager_url.rsplit(":", 1)[1]),
        "alertmanager_existing_url": site.alertmanager_url,
        "alertmanager_existing_config": str(site.alertmanager_config),
        "alertmanager_existing_token_file": str(site.etc / "trainwatch" / "webhook.token"),
        "alertmanager_existing_token_group": "root",
    }
    gpu_vars = {
        "trainwatch_service_manager": "supervisor",
        # the interpreter every user may run (this suite's own lives under /root, 0700): the
        # training user's jobs run the virtualenv's python
        "trainwatch_venv_python": "/usr/bin/python3",
        "trainwatch_pip_extra_args": ["--no-compile"],
        "trainwatch_training_log_dir": "{{ trainwatch_prefix }}/log/jobs",
        "training_exporter_port": port,
        "training_exporter_bind_address": "{{ ansible_host }}",
        "training_exporter_job_users": [users.trainer],
    }
    hosts = {MON: {"ansible_host": ADDRESS[MON],
                   # the site's monitoring host runs no Trainwatch service: no supervisord
                   "trainwatch_service_manager": "systemd"},
             **{gpu: {"ansible_host": ADDRESS[gpu], **gpu_vars} for gpu in GPUS}}
    # gpu-02 keeps the role's default socket (the contract's, the client's default); one
    # machine has one /run/trainwatch, so gpu-01's stays in its prefix, and its TaskProlog
    # tells its jobs
    hosts[GPUS[0]]["training_exporter_socket"] = "{{ trainwatch_prefix }}/run/training.sock"
    path.mkdir(parents=True)
    inventory = path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": common, "hosts": hosts,
        "children": {"monitoring": {"hosts": {MON: None}},
                     "gpu_nodes": {"hosts": dict.fromkeys(GPUS)}}}}))
    return inventory


def installed_record(venv: Path) -> dict:
    """The direct_url.json pip wrote for the project (PEP 610): where it was installed from."""
    found = sorted(venv.glob(
        "lib/python*/site-packages/trainwatch_gpu-*.dist-info/direct_url.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


def loaded_jobs(url: str) -> set[str]:
    config = requests.get(f"{url}/api/v1/status/config", timeout=5).json()["data"]["yaml"]
    return {job["job_name"] for job in yaml.safe_load(config)["scrape_configs"]}


def query(url: str, promql: str) -> list[dict]:
    return requests.get(f"{url}/api/v1/query", params={"query": promql},
                        timeout=5).json()["data"]["result"]


def all_up(url: str, job: str, count: int) -> bool:
    result = query(url, f'up{{job="{job}"}}')
    return len(result) == count and all(sample["value"][1] == "1" for sample in result)


def submit(cluster: SlurmCluster, users: Users, jobs: Path, node: str, venv: Path) -> str:
    """sbatch as the training user, from an environment with nothing of Trainwatch's (sbatch
    passes the submitter's environment on); the job id."""
    script = jobs / f"job-{node}.sh"
    script.write_text("\n".join([
        "#!/bin/bash",
        f"#SBATCH --nodelist={node} --output={jobs}/%j.out",
        f"exec {venv}/bin/python {jobs}/train.py", ""]))
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8", **cluster.env}
    assert not any("TRAINWATCH" in key or "TRAINWATCH" in value for key, value in env.items())
    submitted = subprocess.run(
        ["setpriv", f"--reuid={users.trainer}", "--regid=users", "--init-groups",
         "sbatch", "--parsable", f"--chdir={jobs}", str(script)],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def summary(out: Path) -> dict | None:
    if not out.exists():
        return None
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    return next((line for line in lines if line.get("event") == "summary"), None)


def stop_hosts(root: Path) -> list[str]:
    """Each GPU host's supervisord shut down (what stop.yml does, without a playbook run);
    whatever is left under the root is killed and returned."""
    for gpu in GPUS:
        conf = root / gpu / "etc" / "supervisord.conf"
        if (root / gpu / "run" / "supervisord.pid").exists():
            subprocess.run(["supervisorctl", "-c", str(conf), "shutdown"], capture_output=True,
                           timeout=60, check=False)
    return kill_what_is_left(root, "every process of the deployment to exit")


@pytest.mark.skipif(bool(missing_binaries()), reason="Slurm binaries missing")
def test_a_slurm_site_adds_trainwatch_from_the_collection_and_jobs_report_unset(
        tmp_path: Path, real_binaries: dict[str, str]) -> None:
    # --- the collection as a user downloads and installs it, far from the repository ---
    download = tmp_path / "download"
    download.mkdir()
    archive = Path(shutil.copy2(built_collection(), download))
    collections = tmp_path / "collections"
    env = ansible_env(collections)
    env.pop("PYTHONPATH", None)  # nothing of a checkout on the controller's or services' path
    subprocess.run([str(VENV_BIN / "ansible-galaxy"), "collection", "install", "--offline",
                    "-p", str(collections), str(archive)], cwd=tmp_path, env=env, check=True,
                   capture_output=True, text=True, timeout=300)
    [carried] = sorted(collections.glob(
        "ansible_collections/trainwatch/stack/roles/_common/files/wheels/*.whl"))

    # The hosts' root: the training user must reach the prefixes (each 0750, the service
    # group's), so not pytest's tmp_path (root's alone).
    root = Path(tempfile.mkdtemp(prefix="tw-site-"))
    root.chmod(0o755)
    assert REPO not in tmp_path.parents and not (tmp_path / ".git").exists()
    users = Users.create()
    slurm: SlurmCluster | None = None
    try:
        with site_monitoring(tmp_path) as site:
            port = free_port_on([ADDRESS[g] for g in GPUS])
            inventory = site_inventory(tmp_path / "inventory", root, site, users, port)
            assert users.service not in users.groups_of_trainer()

            def deploy(playbook: str | Path) -> PlaybookRun:
                return run_playbook(playbook, {}, tmp_path, inventory=inventory, env=env,
                                    cwd=tmp_path, timeout=900)

            first = deploy(SITE)
            assert first.rc == 0 and first.total("failed") == 0, first.describe()
            assert set(first.recap) == {MON, *GPUS}, first.describe()
            check_trainwatch_on_the_gpu_nodes(root, carried, users, port)
            check_the_job_environment(root)
            check_the_sites_servers_took_trainwatchs_part(site, root)

            second = deploy(SITE)
            assert second.rc == 0 and second.total("changed") == 0, second.describe()

            # --- the site's Slurm: each node's TaskProlog is the one the role wrote there ---
            slurm = start_slurm(root / "slurm", nodes=GPUS, open_to_users=True, node_conf={
                gpu: [f"TaskProlog={root / gpu / 'etc' / 'slurm-task-prolog.sh'}"]
                for gpu in GPUS})
            jobs = root / "jobs"
            jobs.mkdir()
            shutil.chown(jobs, user=users.trainer)
            (jobs / "train.py").write_text(TRAIN.format(steps=STEPS))
            submitted = {gpu: submit(slurm, users, jobs, gpu, root / gpu / "venv")
                         for gpu in GPUS}
            check_the_jobs_reported(site, root, users, jobs, submitted, slurm)

            # --- a site job named like one of Trainwatch's: a clear failure, the file kept ---
            site.prometheus_config.write_text(site_prometheus_config(
                [SITE_JOB, {"job_name": "node", "static_configs": [{"targets": ["127.0.0.1:1"]}]}]))
            before = site.prometheus_config.read_bytes()
            clash = deploy(PROMETHEUS_ONLY)
            assert clash.rc != 0, clash.describe()
            assert "already has scrape job(s) node that Trainwatch did not write" in clash.output
            assert site.prometheus_config.read_bytes() == before
    finally:
        if slurm is not None:
            slurm.stop()
        left = stop_hosts(root)
        users.remove()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(DEFAULT_SOCKET_DIR, ignore_errors=True)  # absent before (pytestmark)
    assert not left, f"processes left after supervisorctl shutdown: {left}"


def check_trainwatch_on_the_gpu_nodes(root: Path, carried: Path, users: Users,
                                      port: int) -> None:
    """The project from the wheel the collection carries, the training exporter running as
    the service user, nothing else of Trainwatch's; the training user in the service group."""
    assert not processes_under(root / MON)  # nothing of Trainwatch's on the monitoring host
    for gpu in GPUS:
        prefix = root / gpu
        venv = prefix / "venv"
        # the carried wheel on the host byte for byte, installed as an archive (not an
        # editable folder of a checkout)
        host_wheel = prefix / "wheels" / carried.name
        assert host_wheel.read_bytes() == carried.read_bytes()
        record = installed_record(venv)
        assert record["url"] == host_wheel.as_uri() and "archive_info" in record, record
        imported = subprocess.run(
            [str(venv / "bin" / "python"), "-c",
             "import trainwatch.exporters as m; print(m.__file__)"],
            capture_output=True, text=True, check=True, timeout=60, cwd=root,
            env={"PATH": "/usr/bin:/bin"}).stdout.strip()
        assert Path(imported).is_relative_to(venv), imported
        # trainwatch_pip_extra_args reached pip: nothing the exporter never imports compiled
        site_packages = Path(imported).parents[2]
        assert (site_packages / "ansible_runner").is_dir()
        assert not list((site_packages / "ansible_runner").rglob("*.pyc"))
        # the training exporter (the virtualenv's console script) and its supervisord: no
        # Prometheus, Alertmanager or node_exporter of Trainwatch's
        running_here = processes_under(prefix)
        assert any(str(venv / "bin" / "training-exporter") in p for p in running_here), \
            running_here
        assert [p for p in running_here if "training-exporter" not in p] == [
            p for p in running_here if f"supervisord -c {prefix}/etc/" in p], running_here
        wait_until(lambda gpu=gpu: requests.get(
            f"http://{ADDRESS[gpu]}:{port}/metrics", timeout=5).ok, timeout=60,
            what=f"the training exporter of {gpu}")
    assert users.service in users.groups_of_trainer()  # training_exporter_job_users


def check_the_job_environment(root: Path) -> None:
    """One set of job settings: the client's default socket, the role's default (gpu-02) and
    the docs name the same path, and each node's TaskProlog, run as slurmstepd runs it, prints
    its socket and training log directory (each printed export sets the task's env).

    Before: the client sent to /run/trainwatch/training.sock and the role listened on
    <prefix>/run/training.sock, so a job with default settings dropped every report; and the
    log directory was in no job's environment, so a job's handler had none unless its script
    named one."""
    client = MonitorConfig().resolved({})
    assert client.socket_path == catalog.DEFAULT_EXPORTER_SOCKET
    sockets = {GPUS[0]: str(root / GPUS[0] / "run" / "training.sock"),
               GPUS[1]: client.socket_path}
    for gpu in GPUS:
        prolog = root / gpu / "etc" / "slurm-task-prolog.sh"
        printed = subprocess.run([str(prolog)], capture_output=True, text=True, check=True,
                                 env={"PATH": "/usr/bin:/bin"}, timeout=30).stdout
        exported = dict(line.removeprefix("export ").split("=", 1)
                        for line in printed.splitlines())
        # the socket is all a job needs to report: its ranks poll commands on the command
        # socket beside it, which knows them by their kernel identity (no URL, no token)
        assert exported == {catalog.ENV_EXPORTER_SOCKET: sockets[gpu],
                            catalog.ENV_LOG_DIR: str(root / gpu / "log" / "jobs")}, printed
        assert Path(sockets[gpu]).is_socket()
        # a job that chose its own socket or log directory keeps it
        own = subprocess.run([str(prolog)], capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin", catalog.ENV_EXPORTER_SOCKET: "/x",
                                  catalog.ENV_LOG_DIR: "/y"}, timeout=30).stdout
        assert own == ""
    # The docs name that socket wherever they give a production socket path.
    for doc in ("deploy.md", "contracts.md", "training.md"):
        text = (REPO / "docs" / doc).read_text()
        named = set(re.findall(r"(?:^|[\s`=])(/run/\S+?\.sock)\b", text, re.MULTILINE))
        # (and the command socket beside it, derived from it)
        assert named <= {catalog.DEFAULT_EXPORTER_SOCKET,
                         catalog.command_socket(catalog.DEFAULT_EXPORTER_SOCKET)}, (doc, named)
        assert catalog.DEFAULT_EXPORTER_SOCKET in named, (doc, named)


def check_the_sites_servers_took_trainwatchs_part(site: Site, root: Path) -> None:
    # The site's job and Trainwatch's, in the running server; Trainwatch's rules loaded.
    jobs = loaded_jobs(site.prometheus_url)
    assert {"site-own", "prometheus", "alertmanager", "node", "training"} <= jobs, jobs
    groups = requests.get(f"{site.prometheus_url}/api/v1/rules",
                          timeout=5).json()["data"]["groups"]
    assert any(group["name"].startswith("trainwatch-") for group in groups)
    # every host's own node_exporter and both training exporters, scraped by Trainwatch's jobs
    wait_until(lambda: all_up(site.prometheus_url, "node", len(ADDRESS)), timeout=60,
               what="the site's node_exporters scraped by Trainwatch's node job")
    wait_until(lambda: all_up(site.prometheus_url, "training", len(GPUS)), timeout=60,
               what="both training exporters scraped by the site's Prometheus")
    targets = {sample["metric"]["node"] for sample in
               query(site.prometheus_url, 'up{job="training"}')}
    assert targets == set(GPUS), targets

    # The site's receiver and Trainwatch's, in the running Alertmanager; Trainwatch's route
    # first, matched by the label every Trainwatch rule carries, passing alerts on.
    status = requests.get(f"{site.alertmanager_url}/api/v2/status", timeout=5).json()
    config = yaml.safe_load(status["config"]["original"])
    assert {r["name"] for r in config["receivers"]} == {SITE_RECEIVER, "trainwatch-remediation"}
    assert config["route"]["receiver"] == SITE_RECEIVER
    labelled = [route for route in config["route"]["routes"]
                if 'trainwatch="true"' in route.get("matchers", [])]
    assert labelled and labelled[0]["continue"] is True, config["route"]
    assert config["route"]["routes"] == [config["route"]["routes"][0], labelled[0]]  # fast, then it
    [hook] = next(r for r in config["receivers"]
                  if r["name"] == "trainwatch-remediation")["webhook_configs"]
    token = site.etc / "trainwatch" / "webhook.token"
    assert hook["http_config"]["authorization"]["credentials_file"] == str(token)
    assert token.stat().st_mode & 0o777 == 0o640
    # no second Prometheus or Alertmanager: the only ones on this machine with a listener on
    # the monitoring host's address are the site's
    assert not processes_under(root / MON)


def check_the_jobs_reported(site: Site, root: Path, users: Users, jobs: Path,
                            submitted: dict[str, str], slurm: SlurmCluster) -> None:
    outputs = {gpu: jobs / f"{job}.out" for gpu, job in submitted.items()}
    try:
        wait_until(lambda: all(summary(o) for o in outputs.values()), timeout=180,
                   what="both jobs to finish")
    except TimeoutError as exc:
        raise AssertionError("\n".join(
            [str(exc), *(f"--- {o} ---\n{o.read_text() if o.exists() else ''}"
                         for o in outputs.values()), slurm.logs()])) from exc
    uid = users.uid_of_trainer()
    for gpu, job in submitted.items():
        report = summary(outputs[gpu])
        assert report is not None
        # every step reached the node's exporter (the socket the TaskProlog gave the job)
        assert report["dropped"] == 0 and report["datagrams_sent"] > 0, report
        # the job's log file in the node's training log directory, the training user's
        log = root / gpu / "log" / "jobs" / job / "rank-0.jsonl"
        assert report["log"] == str(log), report
        assert log.stat().st_uid == uid
        assert f"step {STEPS} loss" in log.read_text()

        def stepped(gpu: str = gpu, job: str = job) -> bool:
            samples = query(site.prometheus_url, f'training_step{{training_job="{job}"}}')
            return [(s["metric"]["node"], s["value"][1]) for s in samples] == [(gpu, str(STEPS))]

        wait_until(stepped, timeout=60,
                   what=f"job {job}'s last step from {gpu} in the site's Prometheus")
