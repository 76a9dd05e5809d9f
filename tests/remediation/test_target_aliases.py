"""Issue 25 items 2 and 3: one target, one key; a host step re-run is a no-op.

Label values that name one GPU in different spellings (`07`, `7` with a trailing newline that
a `$`-anchored regex accepts) were distinct cooldown keys but the same GPU to the playbook
(Jinja's `| int`, Python's `int()`), so the power limit was cut four times in a row. The
property test generates spellings of GPU indexes and checks, against the readers the playbook
and its tool use, that two values naming one GPU give one key (or are refused), and that the
value the service passes on is the one spelling the tool accepts. The playbook tests run the
real `ansible-playbook` on the shipped `gpu_power_limit.yml` (local connection, fake NVML).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from jinja2.filters import do_int

from tests.ansible.runner import VENV_BIN, ansible_env
from tests.remediation.helpers import REPO, alert, auth, payload
from trainwatch.exporters.node.gpu.nvml_source import ENV_FAKE_NVML
from trainwatch.exporters.node.tools import power_limit
from trainwatch.remediation.ingest import target_key
from trainwatch.remediation.labels import LabelError, canonical, safe_labels
from trainwatch.remediation.playbooks import load_playbooks

BOOKS = load_playbooks(REPO / "remediation" / "playbooks")
GPU_BOOK = BOOKS["gpu_power_limit"]
PLAYBOOK = REPO / "ansible" / "playbooks" / "remediation" / "gpu_power_limit.yml"

# Decorations that Python's int(), Jinja's `| int` or a `$`-anchored regex let through.
PREFIXES = st.sampled_from(["", "", "0", "00", " ", "\t", "+", "0_", "\n"])
SUFFIXES = st.sampled_from(["", "", "\n", " ", ".0", ".9", "e0", "_0", "\r\n"])
SPELLINGS = st.builds(lambda pre, n, post: f"{pre}{n}{post}", PREFIXES,
                      st.integers(min_value=0, max_value=12), SUFFIXES)
NOISE = st.text(alphabet="0123456789 \n\t+-._eE", min_size=1, max_size=6)
VALUES = st.one_of(SPELLINGS, NOISE)


def key(gpu: str) -> str | None:
    """The cooldown key the service makes for an alert on `gpu`, or None when it refuses."""
    try:
        return target_key(GPU_BOOK, {"alertname": "GpuTemperatureHigh", "node": "node-a",
                                     "gpu": gpu})
    except LabelError:
        return None


def lenient_index(value: str) -> int | None:
    """The GPU a lenient reader takes `value` for: Jinja's `| int` (what the playbook used),
    which falls back to int(float(...)); None when it would read no number at all."""
    try:
        float(value)
    except ValueError:
        return None
    return do_int(value)


def tool_index(value: str) -> int | None:
    """The GPU index `python -m trainwatch.exporters.node.tools.power_limit --gpu VALUE` takes,
    or None."""
    try:
        return power_limit.build_parser().parse_args(["--gpu", value, "--restore"]).gpu
    except SystemExit:
        return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=VALUES, b=VALUES)
@example(a="07", b="7")
@example(a="7\n", b="7")
@example(a="007", b="7 ")
def test_two_spellings_of_one_gpu_map_to_one_key(a: str, b: str) -> None:
    key_a, key_b = key(a), key(b)
    for value, k in ((a, key_a), (b, key_b)):
        if k is None:
            continue
        passed = safe_labels({"gpu": value}, ["gpu"])["gpu"]
        assert k == f"node=node-a,gpu={passed}"
        # the value passed on is the one spelling the tool accepts, naming the same GPU
        assert tool_index(passed) == lenient_index(value) == int(passed)
        assert str(tool_index(passed)) == passed
    if key_a is not None and key_b is not None:
        assert (key_a == key_b) == (lenient_index(a) == lenient_index(b)), (a, b)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(["gpu", "rank", "training_job", "node", "instance"]),
       value=st.text(min_size=1, max_size=12))
def test_canonical_spellings_are_fixed_points_without_whitespace(name: str, value: str) -> None:
    try:
        once = canonical(name, value)
    except LabelError:
        return
    assert canonical(name, once) == once
    assert once.strip() == once and "\n" not in once


@settings(max_examples=200, deadline=None)
@given(value=st.text(alphabet="0123456789 \n\t+._e", min_size=1, max_size=5))
def test_the_tool_accepts_exactly_one_spelling_per_gpu(value: str) -> None:
    index = tool_index(value)
    if index is not None:
        assert value == str(index)


def test_service_records_one_key_for_every_spelling_it_accepts(service_factory) -> None:
    """Through the webhook: `0`, `00` and `000` are one GPU and one cooldown key (the
    playbook is passed `0`); `0` with a trailing newline, ` 0` and `0.0` are refused. On the
    code before the fix five spellings were accepted, five keys, and each could act."""
    book = {"name": "gpu_power_limit", "match": {"alertname": ["GpuTemperatureHigh"]},
            "target": ["node", "gpu"], "cooldown": "15m",
            "steps": [{"action": "http", "url": "http://127.0.0.1:1/${labels.gpu}"}]}
    with service_factory([book], start_worker=False) as svc:
        alerts = [alert("GpuTemperatureHigh", {"node": "node-a", "gpu": g})
                  for g in ("0", "00", "000", "0\n", " 0", "0.0")]
        resp = svc.client.post("/v1/alerts", json=payload(*alerts), headers=auth())
        assert resp.status_code == 200, resp.json
        assert (resp.json["accepted"], resp.json["refused"]) == (3, 3)
        keys = {row["target_key"] for row in svc.store.list_intents(state="pending")}
        assert keys == {"node=node-a,gpu=0"}


# --- the shipped playbook itself, with the real ansible-playbook ---------------------------

@pytest.fixture()
def host(tmp_path: Path) -> Path:
    """An inventory of one local host whose GPU is the fake NVML's scenario file."""
    scenario = tmp_path / "gpus.json"
    scenario.write_text(json.dumps({"gpus": [{
        "name": "Fake H100", "uuid": "GPU-alias0", "power_limit_mw": 300000,
        "power_min_mw": 100000, "power_max_mw": 350000, "power_default_mw": 300000}]}))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"node-a": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "trainwatch_python": sys.executable, "trainwatch_fake_nvml": str(scenario),
        "trainwatch_power_limit_state_file": str(tmp_path / "power-state.json")}}}}))
    return tmp_path


def play(workdir: Path, **extra: object) -> subprocess.CompletedProcess[str]:
    env = {**ansible_env(), "ANSIBLE_HOME": str(workdir / "ansible-home"),
           "ANSIBLE_LOCAL_TEMP": str(workdir / "ansible-tmp"), "PYTHONPATH": str(REPO)}
    env.pop(ENV_FAKE_NVML, None)
    return subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(workdir / "inventory.yml"),
         str(PLAYBOOK), "-e", json.dumps(extra)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def limit_mw(workdir: Path) -> int:
    return json.loads((workdir / "gpus.json").read_text())["gpus"][0]["power_limit_mw"]


@pytest.mark.parametrize("alias", ["00", "0\n", " 0", "0.0", "+0", "0_0"])
def test_playbook_refuses_every_other_spelling_of_a_gpu(host: Path, alias: str) -> None:
    """On the code before the fix `00` and `0` followed by a newline passed the playbook's
    `match('^[0-9]{1,3}$')` and the tool's int(): GPU 0 was cut."""
    proc = play(host, gpu_index=alias, power_limit_mode="reduce", reduce_by_percent=15)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "gpu_index must be" in proc.stdout
    assert limit_mw(host) == 300000


def test_playbook_rerun_with_the_same_command_id_is_a_no_op(host: Path) -> None:
    """The documented recovery after a crash is to run the step again (same command id). On
    the code before the fix each run cut 15 % below the limit in force: 300 -> 255 -> 216.75 W.
    """
    step = {"gpu_index": "0", "power_limit_mode": "reduce", "reduce_by_percent": 15,
            "trainwatch_command_id": "0123456789abcdef0123456789abcdef"}
    first = play(host, **step)
    assert first.returncode == 0, first.stdout[-3000:]
    assert limit_mw(host) == 255000
    again = play(host, **step)
    assert again.returncode == 0, again.stdout[-3000:]
    assert limit_mw(host) == 255000
    assert "changed=0" in again.stdout
    restore = {**step, "power_limit_mode": "restore",
               "trainwatch_command_id": "fedcba9876543210fedcba9876543210"}
    for _ in range(2):
        proc = play(host, **restore)
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert limit_mw(host) == 300000
