"""CONTRIBUTING.md's recipes ("Add a GPU metric with an alert and a panel", "Add a remediation
action with rails") are carried out, block by block as the page writes them, in a copy of the
repository: every edit must find its place in the code, and the build and the checks the
recipe names must pass afterwards. A step that stops matching the code fails here, not in a
newcomer's hands."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts import build, doc_facts
from tests.support.repo_copy import ROOT, changed_files, copy_repository, python_path

SECTION = "## Add a GPU metric with an alert and a panel"
ACTION_SECTION = "## Add a remediation action with rails: 1 module plus its test"
# ```LANG recipe PATH MODE [ANCHOR] ... ```
BLOCK = re.compile(r"^```(\w+) recipe (\S+)(?: (before|after|replace|create|append)"
                   r"(?: ([^\n]+))?)?\n(.*?)^```$", re.MULTILINE | re.DOTALL)
MODES = ("before", "after", "replace", "create", "append")


@dataclass(frozen=True)
class Step:
    path: str  # relative to the repository; "run" for a command block
    mode: str
    anchor: str
    text: str


def recipe(page: Path, section_title: str = SECTION) -> list[Step]:
    """The recipe's blocks in page order."""
    text = page.read_text()
    start = text.index(section_title)
    end = text.find("\n## ", start + len(section_title))
    section = text[start:end if end >= 0 else len(text)]
    steps = []
    for _lang, path, mode, anchor, body in BLOCK.findall(section):
        if path != "run" and mode not in MODES:
            raise AssertionError(f"recipe block for {path}: say where it goes ({MODES})")
        steps.append(Step(path, mode, anchor, body))
    return steps


def apply(repo: Path, step: Step) -> None:
    """One edit, as CONTRIBUTING.md describes its block syntax."""
    target = repo / step.path
    if step.mode == "create":
        assert not target.exists(), f"{step.path} exists already"
        target.write_text(step.text)
        return
    if step.mode == "append":
        target.write_text(target.read_text() + step.text)
        return
    lines = target.read_text().splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if line.strip().startswith(step.anchor)]
    assert found, f"{step.path}: no line starts with {step.anchor!r}: the recipe is out of date"
    at = found[0]
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    block = [indent + line if line.strip() else line
             for line in step.text.splitlines(keepends=True)]
    if step.mode == "before":
        lines[at:at] = block
    elif step.mode == "after":
        lines[at + 1:at + 1] = block
    else:  # replace
        lines[at:at + 1] = block
    target.write_text("".join(lines))


def test_the_recipe_is_read_from_the_page() -> None:
    steps = recipe(ROOT / "CONTRIBUTING.md")
    edited = {s.path for s in steps if s.path != "run"}
    assert {"exporters/contract/catalog.py", "alert_rules/config.yml", "alert_rules/gpu.py",
            "dashboards/gpu_node.py", "docs/runbooks.md"} <= edited
    assert steps[-1].path == "run" and "scripts.build" in steps[-1].text


def test_an_anchor_that_left_the_code_fails_the_recipe(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n    y = 2\n")
    apply(tmp_path, Step("a.py", "before", "y = 2", "z = 3\n"))
    assert (tmp_path / "a.py").read_text() == "x = 1\n    z = 3\n    y = 2\n"
    with pytest.raises(AssertionError, match="out of date"):
        apply(tmp_path, Step("a.py", "after", "GONE = (", "w = 4\n"))


@pytest.mark.slow
def test_the_recipe_adds_a_gpu_metric_with_an_alert_and_a_panel(tmp_path: Path) -> None:
    repo = copy_repository(tmp_path / "repo")
    steps = recipe(repo / "CONTRIBUTING.md")
    for step in steps:
        if step.path != "run":
            apply(repo, step)
    edited = {s.path for s in steps if s.path != "run"}
    run_commands(repo, steps)
    changed = changed_files(repo)
    assert edited <= set(changed)
    # what the build and the golden test regenerated, and nothing else
    regenerated = set(changed) - edited
    assert "tests/gpu/golden/simulated_8_gpus.prom" in regenerated
    assert {f"{build.DASHBOARDS_DIR}/gpu-node.json", str(build.DASHBOARD_MAPS),
            "docs/gpu_exporter.md", "docs/contracts.md",
            f"{build.RULES_DIR}/production/gpu.yml", f"{build.RULES_DIR}/dcgm/gpu_source.yml"
            } <= regenerated
    pages = {str(p.relative_to(repo)) for p in doc_facts.pages(repo)}  # the doc facts' pages
    owned = (str(build.RULES_DIR), str(build.DASHBOARDS_DIR), "tests/gpu/golden/")
    assert [p for p in regenerated if not p.startswith(owned) and p not in pages] == []
    golden = (repo / "tests/gpu/golden/simulated_8_gpus.prom").read_text()
    assert "trainwatch_gpu_fan_speed_ratio{" in golden
    assert "GpuFanSpeedHigh" in (repo / build.RULES_DIR / "production" / "gpu.yml").read_text()


def run_commands(repo: Path, steps: list[Step]) -> None:
    """The recipe's command blocks, in the copy, importing trainwatch.* from the copy."""
    for step in steps:
        if step.path == "run":
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", step.text], cwd=repo,
                                  env={**os.environ, "PYTHONPATH": python_path(repo)},
                                  capture_output=True, text=True, timeout=1500, check=False)
            assert done.returncode == 0, (f"the recipe's commands failed:\n{step.text}\n"
                                          f"{done.stdout[-4000:]}{done.stderr[-3000:]}")


@pytest.mark.slow
def test_the_recipe_adds_a_remediation_action_with_rails_in_one_module(tmp_path: Path) -> None:
    """The new action is one module (and its test): no other file changes, the engine least
    of all, and the action's own test and the interface test pass in the copy."""
    repo = copy_repository(tmp_path / "repo")
    steps = recipe(repo / "CONTRIBUTING.md", ACTION_SECTION)
    for step in steps:
        if step.path != "run":
            apply(repo, step)
    edited = {s.path for s in steps if s.path != "run"}
    assert edited == {"remediation/actions/ticket.py", "tests/remediation/test_ticket.py"}
    run_commands(repo, steps)
    assert set(changed_files(repo)) == edited
