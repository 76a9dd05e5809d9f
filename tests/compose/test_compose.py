"""compose/: the compose file that compose/render.yml (Ansible) renders from
docker-compose.yml.j2, checked against the Compose Specification JSON schema (vendored, see
data/SOURCE.md), pinned images, healthchecks, named volumes, required secrets; and the roles'
templates rendered beside it into valid configs (promtool, amtool, JSON) that agree with it.
No Docker engine here: `docker compose up` is verified on real hosts only (docs/deploy.md
gives the commands).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.ansible.runner import REPO
from tests.support.compose import RENDER, render
from trainwatch.exporters.contract import catalog

COMPOSE_DIR = REPO / "compose"
SCHEMA = Path(__file__).with_name("data") / "compose_spec.json"
ONE_SHOT = {"elasticsearch-setup", "kibana-setup"}
PINNED_TAG = re.compile(r"^[\w./-]+:v?\d+\.\d+\.\d+(-[\w.]+)?$")
INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?P<op>:?[-?])?(?P<arg>[^}]*)\}")


@pytest.fixture(scope="module")
def rendered(compose_rendered: Path) -> Path:
    return compose_rendered


@pytest.fixture(scope="module")
def compose_file(rendered: Path) -> Path:
    return rendered / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose(compose_file: Path) -> dict:
    return yaml.safe_load(compose_file.read_text())


@pytest.fixture(scope="module")
def secret_names() -> set[str]:
    """Keys of .env.example that have no value: the secrets the operator must set."""
    names = set()
    for line in (COMPOSE_DIR / ".env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            if not value:
                names.add(name)
    return names


def test_compose_file_matches_the_compose_spec_schema(compose: dict) -> None:
    schema = json.loads(SCHEMA.read_text())
    errors = sorted(jsonschema.Draft201909Validator(schema).iter_errors(compose), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_schema_check_catches_a_broken_file(compose: dict) -> None:
    schema = json.loads(SCHEMA.read_text())
    broken = json.loads(json.dumps(compose))
    broken["services"]["prometheus"]["healthcheck"]["retires"] = 5
    assert not jsonschema.Draft201909Validator(schema).is_valid(broken)


def test_every_image_is_pinned(compose: dict) -> None:
    for name, service in compose["services"].items():
        image = service["image"]
        assert PINNED_TAG.match(image), f"{name}: {image} is not pinned to a release"
        assert not image.endswith(":latest")


def test_every_long_running_service_has_a_healthcheck_and_named_volumes(compose: dict) -> None:
    declared = set(compose["volumes"])
    for name, service in compose["services"].items():
        if name in ONE_SHOT:
            assert service["restart"] == "no"
            continue
        assert service["healthcheck"]["test"], name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name}: volume {source} is not a named volume"
    assert {"prometheus-data", "grafana-data", "elasticsearch-data"} <= declared


def test_no_published_port_of_an_admin_ui_listens_on_every_address(compose: dict) -> None:
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            if name != "logstash":  # Beats input: GPU nodes ship logs to it from outside
                assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"


def test_every_secret_is_required_and_never_defaulted(secret_names: set[str],
                                                      compose_file: Path) -> None:
    text = compose_file.read_text()
    uses = [m for m in INTERPOLATION.finditer(text) if m["name"] in secret_names]
    assert {m["name"] for m in uses} == secret_names, "a secret in .env.example is unused"
    for match in uses:
        assert match["op"] == ":?", f"${{{match['name']}}} must use :? (refuse to start)"
        assert match["arg"].strip(), "the error message tells the operator what to set"
    assert "GRAFANA_ADMIN_PASSWORD" in secret_names and "ELASTIC_PASSWORD" in secret_names
    # No literal password in the file either.
    assert not re.search(r"(?i)password[\"']?\s*[:=]\s*[\"']?(admin|changeme|password)\b", text)


def test_env_example_holds_no_values_for_secrets() -> None:
    for line in (COMPOSE_DIR / ".env.example").read_text().splitlines():
        if re.match(r"^\w*(PASSWORD|TOKEN|KEY)\w*=", line):
            assert line.endswith("="), line


def test_rendered_prometheus_and_alertmanager_configs_are_valid(
        rendered: Path, real_binaries: dict[str, str]) -> None:
    for argv in (["promtool", "check", "config", str(rendered / "prometheus/prometheus.yml")],
                 ["promtool", "check", "rules",
                  *map(str, (rendered / "prometheus/rules").glob("*.yml"))],
                 ["amtool", "check-config", str(rendered / "alertmanager/alertmanager.yml")]):
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    config = yaml.safe_load((rendered / "prometheus/prometheus.yml").read_text())
    targets = {job["job_name"]: {t for sc in job["static_configs"] for t in sc["targets"]}
               for job in config["scrape_configs"]}
    assert targets["gpu"] == {"gpu-01.example.internal:9445", "gpu-02.example.internal:9445"}
    assert targets["alertmanager"] == {"alertmanager:9093"}
    am = yaml.safe_load((rendered / "alertmanager/alertmanager.yml").read_text())
    webhook = next(r for r in am["receivers"] if r["name"] == "remediation")["webhook_configs"][0]
    assert webhook["url"] == "http://remediation:9448/v1/alerts"


def test_rendered_elk_and_grafana_files_are_valid(rendered: Path) -> None:
    for path in (rendered / "elasticsearch").glob("*.json"):
        json.loads(path.read_text())
    lines = (rendered / "kibana/saved-objects.ndjson").read_text().splitlines()
    assert len([json.loads(line) for line in lines if line]) == 8  # data view + 7 searches
    datasources = yaml.safe_load(
        (rendered / "grafana/provisioning/datasources/trainwatch.yml").read_text())
    assert {d["type"] for d in datasources["datasources"]} == {"prometheus", "elasticsearch"}
    assert "${ELASTIC_PASSWORD}" in (rendered / "grafana/provisioning/datasources/trainwatch.yml"
                                      ).read_text()  # expanded by Grafana, not written here
    remediation = yaml.safe_load((rendered / "remediation/remediation.yml").read_text())
    assert remediation["webhook_token_file"].startswith("/run/trainwatch/")


def test_every_mounted_folder_and_the_build_context_exist(compose: dict, rendered: Path) -> None:
    """Relative to the rendered compose file: the configs beside it, the repository's
    dashboards and the build context, wherever the render was written."""
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (rendered / source).exists(), (name, source)
        if "build" in service:
            context = rendered / service["build"]["context"]
            assert (context / service["build"]["dockerfile"]).is_file(), name
            assert context.resolve() == REPO


def test_the_compose_file_agrees_with_the_configs_and_the_contract(
        compose: dict, rendered: Path) -> None:
    """The ports it publishes and probes are the contract's, and each entrypoint writes its
    token to the file that the rendered config reads (names from
    exporters/contract/contract.json)."""
    services = compose["services"]
    for name in ("prometheus", "alertmanager", "grafana", "elasticsearch", "kibana"):
        port = catalog.PORTS[name]
        assert services[name]["ports"] == [f"127.0.0.1:{port}:{port}"], name
        assert f"127.0.0.1:{port}/" in " ".join(services[name]["healthcheck"]["test"]), name
    beats = catalog.PORTS["logstash_beats"]
    assert services["logstash"]["ports"] == [f"{beats}:{beats}"]
    remediation = yaml.safe_load((rendered / "remediation/remediation.yml").read_text())
    am = yaml.safe_load((rendered / "alertmanager/alertmanager.yml").read_text())
    am_token = next(r for r in am["receivers"] if r["name"] == "remediation"
                    )["webhook_configs"][0]["http_config"]["authorization"]["credentials_file"]
    assert am_token == remediation["webhook_token_file"]
    for token, path in (("webhook", remediation["webhook_token_file"]),
                        ("control", remediation["training_exporter_token_file"])):
        assert Path(path).name == Path(catalog.TOKEN_FILES[token]).name
        assert f"> {path}" in services["remediation"]["command"][0], token
    assert f"> {am_token}" in services["alertmanager"]["command"][0]
    probe = " ".join(services["remediation"]["healthcheck"]["test"])
    assert f":{remediation['port']}/healthz" in probe


def test_render_refuses_a_port_the_image_does_not_listen_on(tmp_path: Path) -> None:
    out = tmp_path / "rendered"
    proc = render(out, prometheus_port=19090)
    assert proc.returncode != 0
    assert "the prometheus image listens on" in proc.stdout + proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("nodes", ["gpu-01;rm -rf /", "../etc", "host:9445"])
def test_render_rejects_bad_host_names_and_writes_nothing(tmp_path: Path, nodes: str) -> None:
    out = tmp_path / "rendered"
    proc = render(out, nodes)
    assert proc.returncode != 0
    assert f"not a host name: {nodes}" in proc.stdout + proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_render_uses_the_role_templates_and_defaults() -> None:
    """No variable is given a second value here: compose/vars.yml holds only what differs
    for the containers, the rest is read from the roles' defaults and vars."""
    play = yaml.safe_load(RENDER.read_text())[0]
    for path in play["vars_files"][:-1]:
        assert path.startswith("../ansible/roles/"), path
    templates = play["vars"]["_compose_templates"].values()
    assert all((REPO / "ansible/roles" / t).is_file() for t in templates)
    assert not (COMPOSE_DIR / "render.py").exists()
    overrides = yaml.safe_load((COMPOSE_DIR / "vars.yml").read_text())
    role_values = {}
    for path in play["vars_files"][:-1]:
        role_values.update(yaml.safe_load((COMPOSE_DIR / path).read_text()) or {})
    same = sorted(k for k, v in overrides.items() if role_values.get(k) == v)
    assert not same, f"compose/vars.yml repeats role values: {same}"


def test_a_failed_render_keeps_the_previous_one_and_foreign_folders_are_refused(
        rendered: Path, tmp_path: Path) -> None:
    before = {p.relative_to(rendered): p.read_bytes() for p in rendered.rglob("*") if p.is_file()}
    bad = render(rendered, "../etc")
    assert bad.returncode != 0
    after = {p.relative_to(rendered): p.read_bytes() for p in rendered.rglob("*") if p.is_file()}
    assert after == before
    assert [p.name for p in rendered.parent.iterdir() if p.name.startswith(".rendered")] == []
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    refused = render(foreign)
    assert refused.returncode != 0
    assert "not an earlier render" in refused.stdout + refused.stderr
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    assert (foreign / "notes.txt").read_text() == "mine"


def test_no_long_running_process_keeps_a_secret_in_its_environment(
        compose: dict, secret_names: set[str]) -> None:
    """Issue 11 item 9c: a secret handed over in the environment is written to a file by the
    entrypoint, then dropped (`exec env -u NAME ...`) before the service starts, so its
    children (ansible-playbook and its modules for the remediation service) never see it."""
    for name in ("alertmanager", "remediation"):  # our entrypoints (the others are vendors')
        service = compose["services"][name]
        secrets_here = sorted(set(service.get("environment") or {}) & secret_names)
        exec_part = " ".join(service["command"]).split("exec ", 1)[1]
        assert exec_part.startswith("env "), f"{name}: the service is not exec'd through env -u"
        for secret in secrets_here:
            assert f"-u {secret} " in exec_part, f"{name}: {secret} stays in the environment"


def test_rendered_remediation_inventory_names_the_gpu_nodes_as_alerts_do(
        rendered: Path, tmp_path: Path) -> None:
    """Host actions need an inventory (issue 11 item 1): the GPU nodes under their short names,
    which is what the alerts' `node` label carries; only those resolve."""
    from trainwatch.remediation.inventory import TargetError, resolve_hosts

    config = yaml.safe_load((rendered / "remediation/remediation.yml").read_text())
    assert config["ansible_inventory"] == "/etc/trainwatch/inventory.yml"  # the mounted dir
    inventory = rendered / "remediation/inventory.yml"
    hosts = yaml.safe_load(inventory.read_text())["all"]["hosts"]
    python = "/opt/trainwatch/venv/bin/python"  # the GPU nodes' venv (trainwatch role)
    assert hosts == {"gpu-01": {"ansible_host": "gpu-01.example.internal",
                                "trainwatch_python": python},
                     "gpu-02": {"ansible_host": "gpu-02.example.internal",
                                "trainwatch_python": python}}
    assert resolve_hosts(inventory, ["gpu-02"], tmp_path) == ["gpu-02"]
    with pytest.raises(TargetError):
        resolve_hosts(inventory, ["all"], tmp_path)
