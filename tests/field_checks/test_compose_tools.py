"""The compose file (rendered by compose/render.yml, the `compose_rendered` fixture) checked
by the field's own tools: `docker-compose config -q` (the Debian
docker-compose; `config` needs no Docker engine) with every secret set and with one missing,
and the current Compose Specification schema (vendored, data/SOURCE.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ENV_EXAMPLE = REPO / "compose" / ".env.example"
SCHEMA = Path(__file__).with_name("data") / "compose-spec.json"


@pytest.fixture(scope="module")
def compose_file(compose_rendered: Path) -> Path:
    return compose_rendered / "docker-compose.yml"


@pytest.fixture(scope="module")
def docker_compose() -> str:
    path = shutil.which("docker-compose")
    if path is None:
        pytest.fail("docker-compose missing: run scripts/setup.sh --tests")
    return path


def env_file(directory: Path, *, leave_unset: str = "") -> Path:
    """compose/.env.example with a placeholder in every empty secret (but `leave_unset`)."""
    lines = []
    for line in ENV_EXAMPLE.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and not value and not line.startswith("#") and name != leave_unset:
            line = f"{name}=placeholder-{name.lower()}"
        lines.append(line)
    path = directory / ".env"
    path.write_text("\n".join(lines) + "\n")
    return path


def config_q(docker_compose: str, compose_file: Path, env: Path,
             project: Path | None = None) -> subprocess.CompletedProcess:
    """`config -q` on `compose_file`, its relative paths resolved from `project` (its folder)."""
    project = project or compose_file.parent
    # A clean environment: nothing of the caller's (DOCKER_HOST, a real secret) leaks in.
    return subprocess.run([docker_compose, "--project-directory", str(project),
                           "-f", str(compose_file), "--env-file", str(env), "config", "-q"],
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=120, check=False)


def empty_secrets() -> list[str]:
    return [line.partition("=")[0] for line in ENV_EXAMPLE.read_text().splitlines()
            if line.endswith("=") and not line.startswith("#")]


def test_docker_compose_config_accepts_the_file(docker_compose: str, compose_file: Path,
                                                tmp_path: Path) -> None:
    proc = config_q(docker_compose, compose_file, env_file(tmp_path))
    assert proc.returncode == 0, proc.stderr


def test_docker_compose_config_refuses_a_missing_secret(docker_compose: str, compose_file: Path,
                                                         tmp_path: Path) -> None:
    secret = empty_secrets()[0]
    proc = config_q(docker_compose, compose_file, env_file(tmp_path, leave_unset=secret))
    assert proc.returncode != 0
    assert secret in proc.stderr


def test_docker_compose_config_refuses_an_unknown_key(docker_compose: str, compose_file: Path,
                                                      tmp_path: Path) -> None:
    broken = yaml.safe_load(compose_file.read_text())
    broken["services"]["prometheus"]["healthcheck"]["retires"] = 5
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(broken))
    proc = config_q(docker_compose, path, env_file(tmp_path), compose_file.parent)
    assert proc.returncode != 0
    assert "retires" in proc.stderr


def schema_errors(document: dict) -> list[str]:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]


def test_the_file_matches_the_current_compose_spec_schema(compose_file: Path) -> None:
    assert schema_errors(yaml.safe_load(compose_file.read_text())) == []


def test_the_current_schema_catches_what_the_2021_one_does_not(compose_file: Path) -> None:
    """A key only the current specification knows passes; a misspelt one fails: the vendored
    schema is the current one, and it is strict."""
    document = yaml.safe_load(compose_file.read_text())
    document["services"]["prometheus"]["develop"] = {"watch": [{"path": ".", "action": "rebuild"}]}
    assert schema_errors(document) == []
    document["services"]["prometheus"]["healthcheck"]["retires"] = 5
    assert any("retires" in error for error in schema_errors(document))
