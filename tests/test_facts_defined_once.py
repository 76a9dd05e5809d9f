"""Issue 16, acceptance 2: each port number, token file path and the job-name pattern is
written once outside tests and generated files, in exporters/contract/contract.json (the local
demo's
ports once, in the local inventory); everything else reads it from there."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from trainwatch.exporters.contract import catalog

REPO = Path(__file__).resolve().parents[1]
CONTRACT = REPO / "exporters" / "contract" / "contract.json"
LOCAL_VARS = REPO / "ansible" / "inventories" / "local" / "group_vars" / "all.yml"
# Tests and generated files may repeat a fact (they check it, or were made from it); the
# testinfra tests of molecule scenarios are tests too (they check what a converge set up).
NOT_SOURCES = ("tests", "alert_rules/tests", "**/generated/**", "tests/gpu/golden",
               "ansible/molecule/*/tests/**")
# Exemptions for files still waiting to read the contract: none (compose/ is rendered by
# Ansible from the roles' variables now).
PENDING: tuple[str, ...] = ()


def _where(text: str, *, word: bool) -> set[str]:
    """Tracked files outside tests, generated files and PENDING that contain `text`."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout (git grep)")
    excluded = [f":(exclude,glob){p}" if "*" in p else f":(exclude){p}"
                for p in (*NOT_SOURCES, *PENDING)]
    run = subprocess.run(["git", "grep", "-l", "-F", *(["-w"] if word else []), "-e", text,
                          "--", ".", *excluded], cwd=REPO, capture_output=True, text=True,
                         check=False)
    assert run.returncode in (0, 1), run.stderr
    return set(run.stdout.split())


def _contract() -> dict:
    return json.loads(CONTRACT.read_text())


@pytest.mark.parametrize("service", sorted(_contract()["ports"]))
def test_each_default_port_is_written_once(service: str) -> None:
    port = _contract()["ports"][service]
    assert catalog.PORTS[service] == port
    assert _where(str(port), word=True) == {"exporters/contract/contract.json"}, service


def test_each_demo_port_is_written_once() -> None:
    demo = {name: value for name, value in yaml.safe_load(LOCAL_VARS.read_text()).items()
            if name.endswith("_port")}
    assert len(demo) >= 7
    for name, port in demo.items():
        assert _where(str(port), word=True) == {str(LOCAL_VARS.relative_to(REPO))}, name


@pytest.mark.parametrize("token", sorted(_contract()["token_files"]))
def test_each_token_file_path_is_written_once(token: str) -> None:
    path = _contract()["token_files"][token]
    assert catalog.TOKEN_FILES[token] == path
    assert _where(Path(path).name, word=False) == {"exporters/contract/contract.json"}, path


def test_the_job_name_pattern_is_written_once() -> None:
    pattern = _contract()["job_name_pattern"]
    assert pattern == catalog.JOB_NAME_PATTERN
    # without its anchors, so that a copy written with \A or fullmatch is found too
    assert _where(pattern.strip("^$"), word=False) == {"exporters/contract/contract.json"}
