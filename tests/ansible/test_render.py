"""The roles that cannot run on this machine (Grafana, Elasticsearch, Logstash, Kibana,
Filebeat: no package source reaches them here) and the example-cluster inventory's Prometheus
and Alertmanager configs, rendered by the real role tasks into a scratch root and checked:
promtool/amtool, JSON/YAML validity, modes, pinned versions, no default secrets.
The services themselves are verified on real hosts only (docs/deploy.md gives the commands).
"""

from __future__ import annotations

import getpass
import grp
import json
import os
import re
import secrets
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dashboards.generate import DATASOURCE_UID
from tests.ansible.runner import ANSIBLE, REPO, PlaybookRun, run_playbook
from trainwatch.exporters.contract.catalog import LOG_EVENT_KINDS

EXAMPLE = ANSIBLE / "inventories" / "example-cluster"
RENDER = Path(__file__).with_name("render.yml")
GPU_NODES = [f"gpu-node-0{i}.example.internal" for i in (1, 2, 3)]
MONITORING = ["mon-01.example.internal", "mon-02.example.internal"]
LOGGING = ["log-01.example.internal"]
LONG_TERM = "tsdb-01.example.internal"  # the victoriametrics group, added to the example
VAULT_NAMES = ("vault_trainwatch_webhook_token", "vault_trainwatch_control_token",
               "vault_trainwatch_alertmanager_password",
               "vault_pagerduty_routing_key", "vault_grafana_admin_password",
               "vault_grafana_secret_key", "vault_elasticsearch_elastic_password",
               "vault_elasticsearch_logstash_writer_password", "vault_kibana_encryption_key",
               "vault_kibana_elasticsearch_service_token")


# exporter-toolkit web config: basic auth with a bcrypt hash (of "test"), never a password.
WEB_CONFIG = {"basic_auth_users": {
    "scraper": "$2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG"}}


def render_vars(root: Path, vault: dict[str, str]) -> dict:
    user = getpass.getuser()
    group = grp.getgrgid(os.getgid()).gr_name
    host_root = "{{ render_root }}/{{ inventory_hostname }}"
    owned = {f"{role}_{kind}": value for role in
             ("grafana", "elasticsearch", "logstash", "kibana", "filebeat")
             for kind, value in (("owner", user), ("group", group), ("install", False))}
    return {
        **vault, **owned,
        "ansible_connection": "local",
        "ansible_become": False,  # scratch files only: no root needed
        "ansible_python_interpreter": sys.executable,
        "render_root": str(root),
        "trainwatch_prefix": f"{host_root}/opt/trainwatch",
        # amtool's config defaults to a system path; a render must not write outside its root
        "alertmanager_amtool_config_file": f"{host_root}/etc/prometheus/amtool.yml",
        "trainwatch_service_user": user,
        "trainwatch_service_group": group,
        "trainwatch_supervisorctl": ["true"],  # handlers have no supervisord to talk to here
        "grafana_config_dir": f"{host_root}/etc/grafana",
        "grafana_data_dir": f"{host_root}/var/lib/grafana",
        "elasticsearch_config_dir": f"{host_root}/etc/elasticsearch",
        "logstash_config_dir": f"{host_root}/etc/logstash",
        "logstash_environment_file": f"{host_root}/etc/default/logstash",
        "logstash_validate_config": False,
        "kibana_config_dir": f"{host_root}/etc/kibana",
        "filebeat_config_dir": f"{host_root}/etc/filebeat",
        "filebeat_validate_config": False,
        # Optional web security switched on, so its files are rendered and checked too.
        "prometheus_web_config": WEB_CONFIG,
        "alertmanager_web_config": WEB_CONFIG,
        "prometheus_scrape_http_config": {"basic_auth": {"username": "scraper",
                                                         "password_file": "/etc/hostname"}},
    }


@pytest.fixture(scope="module")
def vault() -> dict[str, str]:
    return {name: secrets.token_urlsafe(36) for name in VAULT_NAMES}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, vault: dict[str, str],
             real_binaries: dict[str, str]) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("render")
    # the example cluster plus a long-term store host (victoriametrics role), remote-written to
    inventory = root / "inventory"
    inventory.mkdir()
    for part in ("hosts.yml", "group_vars"):
        (inventory / part).symlink_to(EXAMPLE / part)
    (inventory / "long-term.yml").write_text(
        yaml.safe_dump({"victoriametrics": {"hosts": {LONG_TERM: None}}}))
    variables = {**render_vars(root, vault), "prometheus_remote_write_victoriametrics": True}
    run = run_playbook(RENDER, variables, root, inventory=inventory)
    assert run.rc == 0 and run.total("failed") == 0, run.describe()
    for value in vault.values():
        assert value not in run.output, "a vault secret reached the Ansible output"
    yield root


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def targets_of(config: dict, job: str) -> set[str]:
    [scrape] = [s for s in config["scrape_configs"] if s["job_name"] == job]
    return {t for sc in scrape["static_configs"] for t in sc["targets"]}


# --- acceptance 4: the example cluster's Prometheus config ------------------------------------

def test_example_cluster_prometheus_scrapes_every_exporter_on_every_gpu_node(
        rendered: Path) -> None:
    path = rendered / MONITORING[0] / "opt/trainwatch/etc/prometheus/prometheus.yml"
    check = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    config = yaml.safe_load(path.read_text())
    for job, port in (("gpu", 9445), ("training", 9446), ("logscan", 9447), ("node", 9100)):
        assert {f"{host}:{port}" for host in GPU_NODES} <= targets_of(config, job), job
    # node_exporter runs on every host of the inventory, the long-term store's too
    assert targets_of(config, "node") == {f"{h}:9100" for h in
                                          GPU_NODES + MONITORING + LOGGING + [LONG_TERM]}
    assert targets_of(config, "remediation") == {f"{MONITORING[0]}:9448"}
    am_targets = {t for am in config["alerting"]["alertmanagers"]
                  for sc in am["static_configs"] for t in sc["targets"]}
    assert am_targets == {f"{host}:9093" for host in MONITORING}
    assert targets_of(config, "alertmanager") == am_targets
    assert config["remote_write"][0]["url"].endswith("/api/v1/push")
    # after the user's own entry: every host of the victoriametrics group
    assert [rw["url"] for rw in config["remote_write"][1:]] == [
        f"http://{LONG_TERM}:8428/api/v1/write"]
    assert all(job["basic_auth"]["username"] == "scraper" for job in config["scrape_configs"])
    web = path.parent / "web.yml"
    assert mode(web) == 0o640 and yaml.safe_load(web.read_text()) == WEB_CONFIG
    check = subprocess.run(["promtool", "check", "web-config", str(web)], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    rules = list((path.parent / "rules").glob("*.yml"))
    assert {p.name for p in rules} == {
        p.name for p in (REPO / "alert_rules/generated/production").glob("*.yml")}


def test_example_cluster_alertmanager_config(rendered: Path, vault: dict[str, str]) -> None:
    path = rendered / MONITORING[1] / "opt/trainwatch/etc/alertmanager/alertmanager.yml"
    check = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert mode(path) == 0o640  # receiver secrets live here
    config = yaml.safe_load(path.read_text())
    receivers = {r["name"]: r for r in config["receivers"]}
    webhook = receivers["remediation"]["webhook_configs"][0]
    assert webhook["url"] == f"http://{MONITORING[0]}:9448/v1/alerts"
    assert webhook["http_config"]["authorization"]["credentials_file"].endswith(
        "/etc/remediation-webhook.token")
    assert receivers["paging"]["pagerduty_configs"][0]["routing_key"] == vault[
        "vault_pagerduty_routing_key"]


def test_example_cluster_alertmanagers_are_cluster_peers(rendered: Path) -> None:
    for host, other in zip(MONITORING, reversed(MONITORING), strict=True):
        argv = json.loads((rendered / host / "opt/trainwatch/alertmanager-argv.json").read_text())
        assert "--cluster.listen-address=0.0.0.0:9094" in argv
        assert [a for a in argv if a.startswith("--cluster.peer=")] == [
            f"--cluster.peer={other}:9094"]


# --- Grafana ----------------------------------------------------------------------------------

def test_gpu_nodes_post_fast_alerts_to_every_alertmanager_with_the_credential(
        rendered: Path, vault: dict[str, str]) -> None:
    """The example cluster's Alertmanagers require basic auth (a network bind): the exporters'
    fast alerts name every one of them and send the credential, from a file only the service
    user reads (the training users share its group, for the rank socket), which the GPU
    exporter's own validation accepts."""
    from trainwatch.exporters.node.gpu.config import build_parser, resolve

    for host in GPU_NODES:
        prefix = rendered / host / "opt/trainwatch"
        argv = json.loads((prefix / "fast-alerts-argv.json").read_text())
        urls = [a.removeprefix("--alertmanager-url=") for a in argv
                if a.startswith("--alertmanager-url=")]
        assert urls == [f"http://{m}:9093" for m in MONITORING]
        password_file = Path(argv[argv.index("--alertmanager-password-file") + 1])
        assert password_file.is_relative_to(prefix)
        assert mode(password_file) == 0o600
        assert password_file.read_text() == vault["vault_trainwatch_alertmanager_password"]
        settings = resolve(build_parser().parse_args(["--node", "gpu-node-01", *argv]))
        assert settings.alertmanager_credential is not None
        assert settings.alertmanager_credential.username == argv[
            argv.index("--alertmanager-username") + 1]


def test_grafana_provisioning(rendered: Path, vault: dict[str, str]) -> None:
    etc = rendered / MONITORING[0] / "etc/grafana"
    ini = etc / "grafana.ini"
    assert mode(ini) == 0o640
    assert f'admin_password = """{vault["vault_grafana_admin_password"]}"""' in ini.read_text()
    datasources = yaml.safe_load((etc / "provisioning/datasources/trainwatch.yml").read_text())
    by_uid = {d["uid"]: d for d in datasources["datasources"]}
    # what every dashboard panel names, and the default
    assert by_uid[DATASOURCE_UID]["url"].endswith(":9090")
    assert by_uid[DATASOURCE_UID]["isDefault"] is True
    assert by_uid["trainwatch-elasticsearch"]["url"] == f"http://{LOGGING[0]}:9200"
    # the long-term store: the same dashboards against it by switching the datasource
    long_term = by_uid["trainwatch-victoriametrics"]
    assert long_term["type"] == "prometheus" and not long_term["isDefault"]
    assert long_term["url"] == f"http://{LONG_TERM}:8428"
    provider = yaml.safe_load((etc / "provisioning/dashboards/trainwatch.yml").read_text())
    dash_dir = Path(provider["providers"][0]["options"]["path"])
    shipped = sorted(p.name for p in (REPO / "dashboards/generated").glob("*.json"))
    assert shipped and sorted(p.name for p in dash_dir.glob("*.json")) == shipped
    for path in dash_dir.glob("*.json"):
        assert json.loads(path.read_text())["uid"]


@pytest.mark.parametrize("password", ["", "admin"])
def test_grafana_refuses_a_missing_or_default_admin_password(
        tmp_path: Path, vault: dict[str, str], password: str) -> None:
    variables = render_vars(tmp_path, {**vault, "vault_grafana_admin_password": password})
    run: PlaybookRun = run_playbook(RENDER, variables, tmp_path, inventory=EXAMPLE,
                                    limit=MONITORING[0])
    assert run.rc != 0
    assert "never installs Grafana with a default password" in run.output
    assert not (tmp_path / MONITORING[0] / "etc/grafana/grafana.ini").exists()


# --- Elasticsearch, Logstash, Kibana, Filebeat ---------------------------------------------------

def test_elasticsearch_ilm_policy_and_composable_template(rendered: Path) -> None:
    setup = rendered / LOGGING[0] / "etc/elasticsearch/trainwatch"
    policy = json.loads((setup / "ilm-policy.json").read_text())["policy"]["phases"]
    assert "rollover" in policy["hot"]["actions"]
    assert policy["delete"] == {"min_age": "30d", "actions": {"delete": {}}}
    template = json.loads((setup / "index-template.json").read_text())
    assert template["index_patterns"] == ["logs-trainwatch-*"]
    assert template["data_stream"] == {}
    assert template["priority"] > 100  # outranks the built-in logs-*-* template
    assert template["template"]["settings"]["index.lifecycle.name"] == "trainwatch-logs"
    assert json.loads((setup / "logstash-writer-role.json").read_text())["indices"]
    es_path = rendered / LOGGING[0] / "etc/elasticsearch/elasticsearch.yml"
    es_yml = yaml.safe_load(es_path.read_text())
    assert es_yml["xpack.security.enabled"] is True


def test_kibana_data_view_and_a_saved_search_per_failure_class(rendered: Path,
                                                                vault: dict[str, str]) -> None:
    etc = rendered / LOGGING[0] / "etc/kibana"
    objects = [json.loads(line) for line in
               (etc / "trainwatch-saved-objects.ndjson").read_text().splitlines() if line]
    [view] = [o for o in objects if o["type"] == "index-pattern"]
    assert view["attributes"]["timeFieldName"] == "@timestamp"
    searches = {o["id"]: o for o in objects if o["type"] == "search"}
    assert set(searches) == {"trainwatch-" + kind.replace("_", "-") for kind in LOG_EVENT_KINDS}
    for kind in LOG_EVENT_KINDS:
        search = searches["trainwatch-" + kind.replace("_", "-")]
        source = json.loads(search["attributes"]["kibanaSavedObjectMeta"]["searchSourceJSON"])
        assert source["query"]["query"] == f'trainwatch.failure_class : "{kind}"'
        assert search["references"][0]["id"] == view["id"]
    kibana_yml = etc / "kibana.yml"
    assert mode(kibana_yml) == 0o640
    assert yaml.safe_load(kibana_yml.read_text())[
        "xpack.encryptedSavedObjects.encryptionKey"] == vault["vault_kibana_encryption_key"]


FRAMEWORK_LINES = {
    "cuda_oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "nccl_timeout": "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)",
    "nccl_error": "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970",
    "elastic_child_failed": "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "rendezvous_timeout": "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
    "nonfinite_loss": "step 120: loss = nan",
    "xid": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
}


def test_logstash_pipeline_classifies_every_failure_class(rendered: Path) -> None:
    etc = rendered / LOGGING[0] / "etc/logstash"
    pipeline = (etc / "conf.d/trainwatch.conf").read_text()
    patterns = dict(re.findall(r'if \[message\] =~ /(.*)/ \{\n\s+mutate \{ add_field => '
                               r'\{ "\[trainwatch\]\[failure_class\]" => "(\w+)"', pipeline))
    by_class = {kind: pattern.replace("\\/", "/") for pattern, kind in patterns.items()}
    assert set(by_class) == set(LOG_EVENT_KINDS)
    for kind, line in FRAMEWORK_LINES.items():
        assert re.search(by_class[kind], line), kind
    assert "${TRAINWATCH_ES_PASSWORD}" in pipeline  # the password is not in the pipeline file
    env_file = rendered / LOGGING[0] / "etc/default/logstash"
    assert mode(env_file) == 0o640


def test_filebeat_ships_rank_files_with_multiline_tracebacks(rendered: Path) -> None:
    path = rendered / GPU_NODES[0] / "etc/filebeat/filebeat.yml"
    assert mode(path) == 0o600
    config = yaml.safe_load(path.read_text())
    [inp] = config["filebeat.inputs"]
    assert inp["type"] == "filestream"
    assert inp["paths"] == ["/var/log/trainwatch/jobs/*/rank-*.jsonl"]
    multiline = inp["parsers"][0]["multiline"]
    continuation = re.compile(multiline["pattern"].replace("[[:space:]]", r"\s"))
    traceback = ['Traceback (most recent call last):', '  File "train.py", line 3, in <module>',
                 "    step()", "RuntimeError: CUDA error: an illegal memory access"]
    assert not continuation.search(traceback[0])
    assert all(continuation.search(line) for line in traceback[1:])
    assert not continuation.search('{"@timestamp": "2026-01-01T00:00:00Z", "message": "x"}')
    assert config["output.logstash"]["hosts"] == [f"{LOGGING[0]}:5044"]


# --- role defaults: pinned versions, no default secrets ----------------------------------------

def role_defaults() -> dict[str, dict]:
    return {path.parents[1].name: yaml.safe_load(path.read_text()) or {}
            for path in (ANSIBLE / "roles").glob("*/defaults/main.yml")}


def test_every_version_is_pinned() -> None:
    versions = {name: value for defaults in role_defaults().values()
                for name, value in defaults.items() if name.endswith("_version")}
    assert len(versions) >= 8
    for name, value in versions.items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", str(value)), f"{name}={value!r} is not pinned"


SECRET_NAME = re.compile(r"password|token$|secret|encryption_key")


def test_no_role_ships_a_default_secret() -> None:
    for role, defaults in role_defaults().items():
        for name, value in defaults.items():
            if SECRET_NAME.search(name) and not name.endswith(("_file", "_user")):
                assert value == "" or "{{" in str(value), f"{role}: {name} has a default value"


def test_every_public_variable_is_documented_and_typed() -> None:
    for role_dir in sorted((ANSIBLE / "roles").iterdir()):
        defaults = yaml.safe_load((role_dir / "defaults/main.yml").read_text()) or {}
        spec = yaml.safe_load((role_dir / "meta/argument_specs.yml").read_text())
        options = spec["argument_specs"]["main"]["options"]
        assert set(options) == set(defaults), role_dir.name
        # the shared role (_common) keeps the trainwatch_ prefix inventories set its variables with
        prefix = "trainwatch" if role_dir.name == "_common" else role_dir.name
        for name, option in options.items():
            assert name.startswith(f"{prefix}_"), name
            assert option["type"] and option["description"], name


def test_a_wrongly_typed_variable_is_rejected_before_anything_is_written(
        tmp_path: Path, vault: dict[str, str]) -> None:
    variables = {**render_vars(tmp_path, vault), "grafana_port": "three thousand"}
    run = run_playbook(RENDER, variables, tmp_path, inventory=EXAMPLE, limit=MONITORING[0])
    assert run.rc != 0
    assert "grafana_port" in run.output
    assert not (tmp_path / MONITORING[0] / "etc/grafana/grafana.ini").exists()
