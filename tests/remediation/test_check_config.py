"""`remediation-server --check-config`: what the remediation role's `validate:` runs before a new
config replaces the one the service was started with. It checks and exits: no store, no port."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.remediation.helpers import write_config


def check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m",
                           "trainwatch.remediation.server", "--config", str(config),
                           "--check-config"], capture_output=True, text=True, timeout=120,
                          check=False)


def test_a_valid_config_passes_without_opening_the_store(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    result = check(config)
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout
    assert not (tmp_path / "remediation.sqlite").exists()


def test_a_bad_config_fails_with_a_reason(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    broken = yaml.safe_load(config.read_text())
    broken["webhook_token_file"] = str(tmp_path / "missing.token")
    config.write_text(yaml.safe_dump(broken))
    result = check(config)
    assert result.returncode == 2
    assert "webhook_token_file" in result.stderr
    missing_dir = write_config(tmp_path / "other", ansible_playbooks_dir=str(tmp_path / "none"))
    result = check(missing_dir)
    assert result.returncode == 2 and "ansible_playbooks_dir" in result.stderr
