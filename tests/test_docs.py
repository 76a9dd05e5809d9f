"""Issue 26, acceptance 6: the docs check. Numbers the code can state (the test count, the
dashboards' query count, the step-histogram bucket count, the example's clip norm) are
generated into the pages by scripts/doc_facts.py and must be current; every fenced `sh
runnable` block of the README and docs runs and exits 0. Each half is shown to fail when a
number or a command drifts. Before, the README said 762 tests, the docs 8 buckets and a clip
norm of 1, and nothing ran a documented command."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from scripts import build, doc_facts

ROOT = doc_facts.ROOT


def test_every_documented_number_is_current() -> None:
    stale = build.plan(only=["doc facts"]).stale()
    assert not stale, f"documented numbers are stale in {stale}: run `python -m scripts.build`"


def test_a_drifted_number_is_caught() -> None:
    values = {"step_duration_buckets": doc_facts.step_duration_buckets()}
    assert doc_facts.rewrite(
        "about <!-- fact: step_duration_buckets -->8<!-- /fact --> buckets\n", values,
        "README.md") == (
        f"about <!-- fact: step_duration_buckets -->{values['step_duration_buckets']}"
        "<!-- /fact --> buckets\n")
    with pytest.raises(KeyError, match="no_such_fact"):
        doc_facts.rewrite("<!-- fact: no_such_fact -->1<!-- /fact -->\n", values, "README.md")


def run_block(block: doc_facts.Block, home: Path, root: Path = ROOT
              ) -> subprocess.CompletedProcess[str]:
    """A block as a reader would run it: bash, from the repository root, a HOME of its own
    (a block may write under ~), failing at its first failing command."""
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "PYTHONPATH": str(root)}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", block.script], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


BLOCKS = list(doc_facts.runnable_blocks())


def test_the_docs_mark_runnable_blocks() -> None:
    assert len(BLOCKS) >= 2
    assert {b.page.name for b in BLOCKS} >= {"README.md", "adopt.md"}


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b.page.name}:{b.line}")
def test_every_runnable_block_runs(block: doc_facts.Block, tmp_path: Path) -> None:
    done = run_block(block, tmp_path / "home")
    assert done.returncode == 0, (f"{block.page.relative_to(ROOT)}:{block.line} failed:\n"
                                  f"{block.script}\n{done.stdout[-2000:]}{done.stderr[-3000:]}")


def test_a_broken_command_is_caught(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "page.md").write_text(
        "text\n\n```sh runnable\ntrue\n.venv/bin/python -m scripts.build --no-such\n"
        "true\n```\n\n```sh\nfalse\n```\n")
    (block,) = doc_facts.runnable_blocks(tmp_path)  # the plain `sh` block is not run
    assert block.line == 3
    done = run_block(block, tmp_path / "home")  # from the repository root, as the docs' are
    assert done.returncode != 0 and "--no-such" in done.stderr


def test_the_gpu_exporter_option_table_names_every_flag_and_config_key() -> None:
    """Issue 26: `--no-gpm` and the `gpm` config key were missing from the table."""
    from trainwatch.exporters.node.gpu.config import CONFIG_SCHEMA, build_parser

    text = (ROOT / "docs" / "gpu_exporter.md").read_text()
    table = text[text.index("| flag | default | meaning |"):]
    table = table[:table.index("\n\n")]
    flags = {opt for action in build_parser()._actions for opt in action.option_strings
             if opt.startswith("--") and opt != "--help"}
    missing = {flag for flag in flags if f"`{flag}" not in table}
    assert not missing, missing
    config_row = next(line for line in table.splitlines() if line.startswith("| `--config"))
    keys = set(CONFIG_SCHEMA["properties"])
    assert not {k for k in keys if k not in config_row}, keys


def test_the_logging_page_names_every_job_id_source() -> None:
    """Issue 26: docs/logging.md listed three of the launcher variables the job id comes from."""
    from trainwatch.exporters.contract import identity

    text = " ".join((ROOT / "docs" / "logging.md").read_text().split())
    for name in (*identity.JOB_ENV_VARIABLES, *identity.PLACEHOLDER_JOB_NAMES,
                 identity.DERIVED_JOB_PREFIX, *identity.RANK_VARIABLES):
        assert f"`{name}" in text, name
