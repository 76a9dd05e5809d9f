"""The GPU error panels read the exporter's sparse series right (real promtool).

The exporter serves XID and ECC counters, the row-remap failure flag and the clock-event
reason flags only while non-zero (docs/gpu_exporter.md, "Sparse error series"). Each panel's
generated queries, with the dashboard's default variables, are evaluated by promtool on a
healthy GPU (no such series) and a GPU whose series appear at 1: the panel shows 0 while
nothing happened (not "no data"), and the first error shows although `increase()` cannot
see a counter born at 1.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from dashboards import check
from tests.dashboards.dashboard_files import load_all

GPU = 'job="gpu",instance="h1:9445",name="H100"'
# GPU 0 healthy all along; GPU 1's error series appear at 3m, at 1
SERIES = [
    (f'trainwatch_gpu_up{{{GPU},gpu="0",uuid="GPU-0"}}', "1x10"),
    (f'trainwatch_gpu_up{{{GPU},gpu="1",uuid="GPU-1"}}', "1x10"),
    (f'trainwatch_gpu_xid_errors_total{{{GPU},gpu="1",uuid="GPU-1",xid="79"}}', "_x3 1x7"),
    (f'trainwatch_gpu_ecc_errors_total{{{GPU},gpu="1",uuid="GPU-1",error_type="uncorrected",'
     'counter="volatile"}', "_x3 1x7"),
    (f'trainwatch_gpu_row_remap_failure{{{GPU},gpu="1",uuid="GPU-1"}}', "_x3 1x7"),
    (f'trainwatch_gpu_clock_event_reason_active{{{GPU},gpu="1",uuid="GPU-1",'
     'reason="hw_thermal_slowdown"}', "_x3 1x7"),
]
# (dashboard uid, panel, legend of the target) -> (value at 2m: healthy, value at 6m)
COUNTS = {
    ("trainwatch-gpu-fleet", "Uncorrectable ECC errors", "GPUs with errors"): (0, 1),
    ("trainwatch-gpu-fleet", "XID errors", "GPUs with XIDs"): (0, 1),
    ("trainwatch-gpu-node", "ECC errors", "GPUs with errors"): (0, 1),
}


def _targets() -> dict[tuple[str, str, str], str]:
    out = {}
    for dashboard in load_all().values():
        values = {**check.BUILTINS, **check.variable_defaults(dashboard)}
        for panel in check.panels(dashboard):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    key = (dashboard["uid"], panel["title"], target.get("legendFormat", ""))
                    out[key] = check.substitute(target["expr"], values)
    return out


def _promtool(real_binaries: dict[str, str], tmp_path: Path, tests: list[dict]) -> None:
    path = tmp_path / "panels_test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in SERIES],
        "promql_expr_test": tests}]}))
    result = subprocess.run([real_binaries["promtool"], "test", "rules", path.name],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_error_counts_read_zero_when_healthy_and_see_a_counter_born_at_one(
        real_binaries: dict[str, str], tmp_path: Path) -> None:
    targets = _targets()
    tests = []
    for key, (healthy, after) in COUNTS.items():
        for at, expected in (("2m", healthy), ("6m", after)):
            tests.append({"expr": targets[key], "eval_time": at,
                          "exp_samples": [{"labels": "{}", "value": expected}]})
    _promtool(real_binaries, tmp_path, tests)


def test_flag_lines_are_zero_per_gpu_until_the_flag_is_served(
        real_binaries: dict[str, str], tmp_path: Path) -> None:
    targets = _targets()
    remap = targets[("trainwatch-gpu-node", "Remapped rows", "GPU {{gpu}} failure")]
    reasons = targets[("trainwatch-gpu-node", "Clock-event reasons", "GPU {{gpu}} {{reason}}")]

    def samples(flag: int, extra: str = "") -> list[dict]:
        return [{"labels": f'{{{GPU},gpu="0",uuid="GPU-0"}}', "value": 0},
                {"labels": f'{{{GPU},gpu="1",uuid="GPU-1"{extra}}}', "value": flag}]

    # the served flag keeps its name, the zero lines (trainwatch_gpu_up * 0) have none
    _promtool(real_binaries, tmp_path, [
        {"expr": remap, "eval_time": "2m", "exp_samples": samples(0)},
        {"expr": f"sum without (__name__) ({remap})", "eval_time": "6m",
         "exp_samples": samples(1)},
        {"expr": reasons, "eval_time": "2m", "exp_samples": samples(0)},
        {"expr": f"sum without (__name__) ({reasons})", "eval_time": "6m",
         "exp_samples": samples(1, ',reason="hw_thermal_slowdown"')},
    ])


def test_throttled_gpus_by_reason_reads_none_zero_until_a_reason_is_active(
        real_binaries: dict[str, str], tmp_path: Path) -> None:
    expr = _targets()[("trainwatch-gpu-fleet", "Throttled GPUs by reason", "{{reason}}")]
    _promtool(real_binaries, tmp_path, [
        {"expr": expr, "eval_time": "2m",
         "exp_samples": [{"labels": '{reason="none"}', "value": 0}]},
        {"expr": expr, "eval_time": "6m",
         "exp_samples": [{"labels": '{reason="hw_thermal_slowdown"}', "value": 1}]},
    ])
