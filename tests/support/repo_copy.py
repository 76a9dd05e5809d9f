"""A copy of the repository as it is checked out (tracked files and new ones git does not
ignore, uncommitted edits included), committed into a git repository of its own, so that a
test can run the build or follow a recipe there and read `git status` afterwards without
touching the tree other tests read."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_GIT_IDENTITY = ("-c", "user.name=trainwatch-tests", "-c", "user.email=tests@example.invalid")


def git(repo: Path, *args: str) -> str:
    """Run git in `repo` (no hooks, no global config) and return its stdout."""
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *_GIT_IDENTITY, *args], cwd=repo, env=env, check=True,
                          capture_output=True, text=True, timeout=120).stdout


def copy_repository(dest: Path) -> Path:
    """`dest` holding the checkout's files, committed; `.venv` links to the checkout's (git
    ignores it), so commands written as `.venv/bin/python ...` run there as they do here."""
    listed = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    dest.mkdir(parents=True, exist_ok=True)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the checkout is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--no-verify", "-m", "the checkout, copied")
    return dest


def python_path(repo: Path) -> str:
    """PYTHONPATH under which a copy imports its own code: the copy itself (scripts,
    alert_rules, dashboards, tests) and a namespace folder beside it whose `trainwatch`
    holds links to the copy's exporters/ and remediation/. The path entries come before the
    editable install's finder, so `trainwatch.*` resolves to the copy, not to the checkout
    the virtualenv was installed from."""
    namespace = repo.with_name(repo.name + ".namespace") / "trainwatch"
    if not namespace.is_dir():
        namespace.mkdir(parents=True)
        for folder in ("exporters", "remediation"):
            (namespace / folder).symlink_to(repo / folder, target_is_directory=True)
    return f"{namespace.parent}{os.pathsep}{repo}"


def changed_files(repo: Path) -> list[str]:
    """Paths `git status` reports as modified, added, deleted or new, sorted."""
    out = git(repo, "status", "--porcelain", "--untracked-files=all")
    return sorted(line[3:] for line in out.splitlines())
