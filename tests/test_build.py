"""Issue 27, acceptance 2: one build command regenerates every generated file, and after it
`git status` is clean (the committed files are the build's output); `--check` names the stale
ones and writes nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import build
from tests.support.repo_copy import changed_files, copy_repository, python_path


def run_build(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scripts.build", *args], cwd=repo,
                          env={**os.environ, "PYTHONPATH": python_path(repo)},
                          capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.slow
def test_the_build_leaves_a_clean_tree_and_check_names_what_is_stale(tmp_path: Path) -> None:
    repo = copy_repository(tmp_path / "repo")
    done = run_build(repo)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "", f"the build rewrote committed files:\n{done.stdout}"
    assert changed_files(repo) == [], "committed generated files are stale: run the build"

    # a generated file edited by hand, one deleted, one no longer generated, a stale fact
    rules = repo / build.RULES_DIR / "production"
    (rules / "gpu.yml").write_text("# edited by hand\n")
    (repo / build.LOGSTASH_VARS).unlink()
    (rules / "renamed.yml").write_text("groups: []\n")
    readme = repo / "README.md"
    readme.write_text(re.sub(r"(<!-- fact: test_count -->)[^<]*", r"\g<1>1", readme.read_text()))
    expected = sorted(["README.md", str(build.LOGSTASH_VARS),
                       f"{build.RULES_DIR}/production/gpu.yml",
                       f"{build.RULES_DIR}/production/renamed.yml"])
    before = {p: (repo / p).read_text() for p in expected if (repo / p).exists()}
    check = run_build(repo, "--check")
    assert check.returncode == 1
    assert sorted(line.split()[1] for line in check.stderr.splitlines()) == expected
    assert {p: (repo / p).read_text() for p in expected if (repo / p).exists()} == before

    done = run_build(repo)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(done.stdout.split("\n")[:-1]) == sorted(
        [*(p for p in expected if not p.endswith("renamed.yml")),
         f"removed {build.RULES_DIR}/production/renamed.yml"])
    assert changed_files(repo) == []


def test_a_step_owns_its_folder_and_removes_only_its_own_stale_files(tmp_path: Path) -> None:
    folder = tmp_path / "generated"
    folder.mkdir()
    (folder / "old.yml").write_text("dropped output")
    (folder / "keep.yml").write_text("old text")
    (folder / "notes.txt").write_text("not ours: the glob does not match it")
    tree = build.Tree(tmp_path)
    tree.folder(Path("generated"), {"keep.yml": "new", "new.yml": "fresh"}, "*.yml")
    tree.put(Path("a", "b", "made.json"), "{}")  # a missing folder is created
    assert tree.stale() == [Path("a/b/made.json"), Path("generated/keep.yml"),
                            Path("generated/new.yml"), Path("generated/old.yml")]
    assert (folder / "old.yml").exists()  # planning writes nothing
    tree.write()
    assert sorted(p.name for p in folder.iterdir()) == ["keep.yml", "new.yml", "notes.txt"]
    assert (folder / "keep.yml").read_text() == "new"
    assert (tmp_path / "a" / "b" / "made.json").read_text() == "{}"
    assert tree.stale() == []


def test_a_later_step_reads_an_earlier_ones_output(tmp_path: Path) -> None:
    (tmp_path / "page.md").write_text("on disk")
    tree = build.Tree(tmp_path)
    assert tree.read(Path("page.md")) == "on disk"
    tree.put(Path("page.md"), "rendered")
    assert tree.read(Path("page.md")) == "rendered"


def test_unknown_steps_and_a_stray_out_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="no such step"):
        build.plan(only=["no such step"])
    assert build.main(["--out", "/tmp/x"]) == 2
    assert "--out goes with an overlay" in capsys.readouterr().err


def test_every_step_is_named_in_contributing() -> None:
    """The contributor's page lists what the build writes (STEPS is the one list)."""
    text = (build.ROOT / "CONTRIBUTING.md").read_text().replace("\n", " ")
    for step in build.STEPS:
        assert step.name.lower() in text.lower(), step.name


def test_the_generators_have_no_command_of_their_own() -> None:
    """One way to regenerate: the modules the build calls have no `main` (they had four)."""
    from alert_rules import generate, kubernetes
    from dashboards import generate as dashboards
    from dashboards import kubernetes as dashboard_maps
    from scripts import doc_facts, metric_docs
    from trainwatch.exporters.node.logs import logstash

    for module in (generate, kubernetes, dashboards, dashboard_maps, logstash, doc_facts,
                   metric_docs):
        assert not hasattr(module, "main"), module.__name__
