"""`python -m exporters.gpu.power_limit` against a file-backed fake NVML (no GPU here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from exporters.gpu import power_limit
from exporters.gpu.fake_nvml import ENV_FAKE_NVML, simulated_scenario

UUID0 = "GPU-5a1e0000-0000-4000-8000-000000000000"


@pytest.fixture
def scenario_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    scenario = simulated_scenario(2, dynamic=False)
    scenario["gpus"][0]["power_limit_mw"] = 600_000  # the operator's limit, below default
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    monkeypatch.setenv(ENV_FAKE_NVML, str(path))
    monkeypatch.delenv(power_limit.ENV_STATE_FILE, raising=False)
    return path


def limit_mw(path: Path, gpu: int = 0) -> int:
    return json.loads(path.read_text())["gpus"][gpu]["power_limit_mw"]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert power_limit.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_reduce_then_restore_puts_back_the_operators_limit(scenario_file: Path, capsys) -> None:
    result = run_json(capsys, "--gpu", "0", "--reduce-by-percent", "15")
    assert (result["before_watts"], result["after_watts"]) == (600.0, 510.0)
    assert limit_mw(scenario_file) == 510_000
    run_json(capsys, "--gpu", "0", "--reduce-by-percent", "10")
    assert limit_mw(scenario_file) == 459_000
    result = run_json(capsys, "--gpu", "0", "--restore")
    assert result["after_watts"] == 600.0  # the saved original, not the 700 W default
    assert limit_mw(scenario_file) == 600_000
    result = run_json(capsys, "--gpu", "0", "--restore")  # nothing saved any more: default
    assert result["after_watts"] == 700.0
    assert limit_mw(scenario_file, gpu=1) == 700_000  # the other GPU is untouched


def test_target_is_clamped_to_the_cards_range(scenario_file: Path, capsys) -> None:
    result = run_json(capsys, "--gpu", "1", "--watts", "50")
    assert result["clamped"] is True
    assert result["after_watts"] == 200.0 == result["min_watts"]
    result = run_json(capsys, "--gpu", "1", "--watts", "900")
    assert result["after_watts"] == 700.0


def test_dry_run_changes_nothing(scenario_file: Path, capsys) -> None:
    before = scenario_file.read_text()
    result = run_json(capsys, "--gpu", "0", "--watts", "300", "--dry-run")
    assert result["after_watts"] == 300.0 and result["dry_run"] is True
    assert scenario_file.read_text() == before
    assert not list(scenario_file.parent.glob("*power_limit_state*"))


@pytest.mark.parametrize("argv", [
    ["--gpu", "0"],
    ["--gpu", "0", "--watts", "300", "--restore"],
    ["--gpu", "0", "--reduce-by-percent", "0"],
    ["--gpu", "0", "--reduce-by-percent", "95"],
    ["--gpu", "0", "--watts", "abc"],
    ["--gpu", "-1", "--watts", "300"],
    ["--gpu", "0;reboot", "--watts", "300"],
])
def test_bad_arguments_exit_2_and_change_nothing(scenario_file: Path, argv, capsys) -> None:
    before = scenario_file.read_text()
    with pytest.raises(SystemExit) as exc:
        power_limit.main(argv)
    assert exc.value.code == 2
    assert scenario_file.read_text() == before


def test_unknown_gpu_and_nvml_failures_exit_1_with_a_reason(scenario_file: Path, capsys) -> None:
    before = scenario_file.read_text()
    assert power_limit.main(["--gpu", "7", "--watts", "300"]) == 1
    assert "GPU 7 does not exist" in capsys.readouterr().err
    scenario = json.loads(before)
    scenario["gpus"][0]["errors"] = {"nvmlDeviceSetPowerManagementLimit": "NoPermission"}
    scenario_file.write_text(json.dumps(scenario))
    assert power_limit.main(["--gpu", "0", "--watts", "300"]) == 1
    assert "NoPermission" in capsys.readouterr().err
    assert limit_mw(scenario_file) == 600_000


def test_module_entry_point_runs_as_ansible_calls_it(scenario_file: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exporters.gpu.power_limit", "--gpu", "0",
         "--reduce-by-percent", "15"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "600 W -> 510 W" in proc.stdout
    assert limit_mw(scenario_file) == 510_000
    state = json.loads(scenario_file.with_name("scenario.power_limit_state.json").read_text())
    assert state == {UUID0: 600_000}
