"""`python -m trainwatch.exporters.node.tools.power_limit` against a file-backed fake NVML (no GPU
here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainwatch.exporters.node.gpu.fake_nvml import simulated_scenario
from trainwatch.exporters.node.gpu.nvml_source import ENV_FAKE_NVML
from trainwatch.exporters.node.tools import power_limit

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
    # absolute: 10 % below the saved original (600 W), not below the 510 W in force
    run_json(capsys, "--gpu", "0", "--reduce-by-percent", "10")
    assert limit_mw(scenario_file) == 540_000
    result = run_json(capsys, "--gpu", "0", "--restore")
    assert result["after_watts"] == 600.0  # the saved original, not the 700 W default
    assert limit_mw(scenario_file) == 600_000
    result = run_json(capsys, "--gpu", "0", "--restore")  # the original is back: no change
    assert result["after_watts"] == 600.0
    assert limit_mw(scenario_file, gpu=1) == 700_000  # the other GPU is untouched
    scenario = json.loads(scenario_file.read_text())  # nothing of ours saved for this GPU:
    scenario["gpus"][1]["power_limit_mw"] = 650_000  # restore falls back to the default
    scenario_file.write_text(json.dumps(scenario))
    assert run_json(capsys, "--gpu", "1", "--restore")["after_watts"] == 700.0


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
        [sys.executable, "-m", "trainwatch.exporters.node.tools.power_limit", "--gpu", "0",
         "--reduce-by-percent", "15"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "600 W -> 510 W" in proc.stdout
    assert limit_mw(scenario_file) == 510_000
    state = json.loads(scenario_file.with_name("scenario.power_limit_state.json").read_text())
    assert state == {"version": 2, "gpus": {UUID0: {
        "original_mw": 600_000, "ours": True, "command_id": None, "complete": True,
        "done": []}}}


# --- Issue 25 item 3: a re-run of the same step is a no-op ---------------------------------

def test_repeated_reduction_converges_on_one_absolute_target(scenario_file: Path,
                                                              capsys) -> None:
    """Even without a command id (an operator's manual re-run) a reduction is computed from
    the saved original. On the code before the fix: 600 -> 510 -> 433.5 -> 368.5 W."""
    for _ in range(3):
        result = run_json(capsys, "--gpu", "0", "--reduce-by-percent", "15")
        assert result["after_watts"] == 510.0
    assert limit_mw(scenario_file) == 510_000


def test_rerun_of_a_reduction_is_a_no_op_whatever_crashed(scenario_file: Path, capsys) -> None:
    """The documented recovery after a crash is to run the step again. On the code before the
    fix every run cut 15 % below the limit in force: 600 -> 510 -> 433.5 -> 368.5 W."""
    for _ in range(3):
        run_json(capsys, "--gpu", "0", "--reduce-by-percent", "15", "--command-id", "c1")
        assert limit_mw(scenario_file) == 510_000
    # another alert's command converges on the same absolute target
    result = run_json(capsys, "--gpu", "0", "--reduce-by-percent", "15", "--command-id", "c2")
    assert result["after_watts"] == 510.0 and result["original_watts"] == 600.0
    # a restore re-run (its first run completed) leaves the operator's limit alone
    run_json(capsys, "--gpu", "0", "--restore", "--command-id", "r1")
    scenario = json.loads(scenario_file.read_text())
    scenario["gpus"][0]["power_limit_mw"] = 620_000  # the operator changes it afterwards
    scenario_file.write_text(json.dumps(scenario))
    result = run_json(capsys, "--gpu", "0", "--restore", "--command-id", "r1")
    assert result["already_applied"] is True and limit_mw(scenario_file) == 620_000


def test_a_run_killed_between_saving_and_setting_is_finished_by_the_rerun(
        scenario_file: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """The state is written before the limit changes: a crash in between leaves the original
    saved, and the re-run completes the change from it (not from the current limit)."""
    from trainwatch.exporters.node.gpu import fake_nvml

    def crash(*_args: object) -> None:
        raise SystemExit(137)

    with monkeypatch.context() as patch:
        patch.setattr(fake_nvml.FakeNvml, "nvmlDeviceSetPowerManagementLimit", crash)
        with pytest.raises(SystemExit):
            power_limit.main(["--gpu", "0", "--reduce-by-percent", "15", "--command-id", "c1"])
    assert limit_mw(scenario_file) == 600_000
    run_json(capsys, "--gpu", "0", "--reduce-by-percent", "15", "--command-id", "c1")
    assert limit_mw(scenario_file) == 510_000
    # the restore: killed after setting the limit, before it was marked complete
    real_write = power_limit._write_state
    writes: list[int] = []

    def die_on_second_write(path: Path, state: dict) -> None:
        writes.append(1)
        if len(writes) == 2:
            raise SystemExit(137)
        real_write(path, state)

    with monkeypatch.context() as patch:
        patch.setattr(power_limit, "_write_state", die_on_second_write)
        with pytest.raises(SystemExit):
            power_limit.main(["--gpu", "0", "--restore", "--command-id", "r1"])
    assert limit_mw(scenario_file) == 600_000
    result = run_json(capsys, "--gpu", "0", "--restore", "--command-id", "r1")
    assert (result["after_watts"], result["already_applied"]) == (600.0, False)
    again = run_json(capsys, "--gpu", "0", "--restore", "--command-id", "r1")
    assert again["already_applied"] is True and limit_mw(scenario_file) == 600_000


@pytest.mark.parametrize("argv", [
    ["--gpu", "0", "--watts", "nan"],
    ["--gpu", "0", "--watts", "inf"],
    ["--gpu", "0", "--reduce-by-percent", "nan"],
    ["--gpu", "0", "--reduce-by-percent", "NaN"],
    ["--gpu", "07", "--watts", "300"],
    ["--gpu", "0\n", "--watts", "300"],
    ["--gpu", " 0", "--watts", "300"],
    ["--gpu", "+0", "--watts", "300"],
    ["--gpu", "0_0", "--watts", "300"],
    ["--gpu", "0", "--watts", "300", "--command-id", "a b"],
])
def test_non_finite_and_non_canonical_arguments_exit_2(scenario_file: Path, argv, capsys) -> None:
    """Issue 25 items 2 and 5: NaN passed the range check (every comparison is false) and
    int() took " 0", "07", "0\\n" and "0_0" as GPU 0, aliases the service keys apart."""
    before = scenario_file.read_text()
    with pytest.raises(SystemExit) as exc:
        power_limit.main(argv)
    assert exc.value.code == 2
    assert scenario_file.read_text() == before


def test_a_state_file_of_the_earlier_format_still_restores(scenario_file: Path, capsys) -> None:
    """`{uuid: milliwatts}` (written before the state had versions) reads as "original saved,
    our change in force"; an unknown version is refused, not guessed at."""
    state = scenario_file.with_name("scenario.power_limit_state.json")
    state.write_text(json.dumps({UUID0: 650_000}))
    assert run_json(capsys, "--gpu", "0", "--restore")["after_watts"] == 650.0
    state.write_text(json.dumps({"version": 3, "gpus": {}}))
    assert power_limit.main(["--gpu", "0", "--restore"]) == 1
    assert "version 3" in capsys.readouterr().err
