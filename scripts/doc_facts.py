"""Numbers the code can state, written into the docs instead of typed; and the docs' runnable
command blocks.

A number in a page between `<!-- fact: NAME -->` and `<!-- /fact -->` is this script's output
(FACTS below says where each comes from). A fenced block whose info string is `sh runnable`
is a command sequence the docs check runs (bash -eu, from the repository root, with a
scratch HOME), so a documented command that stops working fails the suite.

`python -m scripts.build` rewrites the facts in the pages (its `--check` names stale ones).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "CONTRIBUTING.md", "docs/*.md", "alert_rules/README.md",
         "dashboards/README.md")
FACT = re.compile(r"<!-- fact: (\w+) -->(.*?)<!-- /fact -->")
RUNNABLE = re.compile(r"^```sh runnable\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_count() -> str:
    """Tests pytest collects in the whole suite (what scripts/test.sh runs)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider"], capture_output=True, text=True,
                          cwd=ROOT, timeout=600, check=False)
    match = re.search(r"^(\d+) tests? collected", done.stdout, re.MULTILINE)
    if not match:
        raise RuntimeError(f"pytest --collect-only said:\n{done.stdout[-2000:]}{done.stderr}")
    return f"{int(match[1]):,}"


def dashboard_queries() -> str:
    """PromQL queries of every dashboard's panels (from the generator, not the files it wrote:
    the build counts the dashboards it is about to write)."""
    from dashboards import check
    from dashboards.generate import render_dashboards

    return str(sum(len(check.panel_queries(json.loads(text)))
                   for text in render_dashboards().values()))


def step_duration_buckets() -> str:
    """Buckets of a rank's step-time histogram, +Inf included (what a rule reading it reads)."""
    from trainwatch.exporters.node.training.store import STEP_DURATION_BUCKETS

    return str(len(STEP_DURATION_BUCKETS) + 1)


def example_clip_norm() -> str:
    """examples/train_ddp.py's default gradient-norm clip (its --clip argument)."""
    tree = ast.parse((ROOT / "examples" / "train_ddp.py").read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
                and node.args and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "--clip"):
            for keyword in node.keywords:
                if keyword.arg == "default":
                    return f"{ast.literal_eval(keyword.value):g}"
    raise RuntimeError("examples/train_ddp.py has no --clip default")


FACTS: dict[str, Callable[[], str]] = {
    "test_count": test_count,
    "dashboard_queries": dashboard_queries,
    "step_duration_buckets": step_duration_buckets,
    "example_clip_norm": example_clip_norm,
}


def pages(root: Path = ROOT) -> list[Path]:
    return sorted({p for pattern in PAGES for p in root.glob(pattern)})


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    script: str


def runnable_blocks(root: Path = ROOT) -> Iterator[Block]:
    for page in pages(root):
        text = page.read_text()
        for match in RUNNABLE.finditer(text):
            yield Block(page, text.count("\n", 0, match.start()) + 1, match[1])


def rewrite(text: str, values: dict[str, str], where: str) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match[1]
        if name not in values:
            raise KeyError(f"{where}: unknown fact {name!r} (known: {sorted(FACTS)})")
        return f"<!-- fact: {name} -->{values[name]}<!-- /fact -->"
    return FACT.sub(replace, text)
