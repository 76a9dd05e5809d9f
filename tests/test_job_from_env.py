"""Every part names a job the same way from the launcher's environment, and accepts the same
job names (trainwatch.exporters.contract.identity: one job_from_env, one JOB_NAME_PATTERN)."""

from __future__ import annotations

import argparse
import json

import pytest

from trainwatch.exporters.contract import wire
from trainwatch.exporters.contract.identity import detect_job, is_job_name, validate_job
from trainwatch.exporters.contract.launcher import detect
from trainwatch.exporters.node.gpu.processes import job_and_rank
from trainwatch.exporters.node.logs import scanner_cli
from trainwatch.exporters.node.logs.follower import source_for


def test_torchrun_placeholder_run_id_is_not_a_job_name_anywhere() -> None:
    env = {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "WORLD_SIZE": "2"}
    assert detect_job(env) == "default"
    assert detect(env=env).job == "default"
    assert job_and_rank(env) == ("", "1")
    env["SLURM_JOB_ID"] = "4242"
    assert detect_job(env) == detect(env=env).job == job_and_rank(env)[0] == "4242"


def _accepted_by(name: str) -> dict[str, bool]:
    """Whether each part that takes a job name accepts `name`."""
    found: dict[str, bool] = {}
    try:
        found["training client"] = detect(env={}, job=name).job == name
    except ValueError:
        found["training client"] = False
    try:
        found["log handler"] = validate_job(name) == name
    except ValueError:
        found["log handler"] = False
    try:
        scanner_cli._job(name)
        found["log scanner --job"] = True
    except argparse.ArgumentTypeError:
        found["log scanner --job"] = False
    found["log scanner file layout"] = source_for(f"/logs/{name}/rank-0.jsonl", "k").job == name
    try:
        wire.decode(json.dumps({"v": wire.VERSION, "job": name, "world_size": 1,
                                "rank": 0}).encode())
        found["exporter datagram"] = True
    except wire.WireError:
        found["exporter datagram"] = False
    attributed = job_and_rank({"TRAINWATCH_JOB": name})[0]
    found["GPU process attribution"] = bool(name) and attributed == name
    return found


@pytest.mark.parametrize(("name", "valid"), [
    ("llm-7b.run_2:a", True),
    ("4242", True),
    ("j" + "x" * 127, True),
    ("j" + "x" * 128, False),
    ("job@1", False),  # the GPU exporter accepted '@' and '+': a job no training metric carries
    ("run+2", False),
    ("job\n", False),  # `$` matches before a final newline; the whole name must match
    ("-job", False),
    ("_job", False),
    ("a/b", False),
    ("", False),
])
def test_every_part_accepts_the_same_job_names(name: str, valid: bool) -> None:
    assert is_job_name(name) is valid
    assert _accepted_by(name) == dict.fromkeys(_accepted_by("ok"), valid)
