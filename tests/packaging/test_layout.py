"""Issue 27, acceptance 1: the tree shows where code runs.

`trainwatch.exporters.rank` is the library inside every training process;
`trainwatch.exporters.node` runs beside
the job on the GPU node; `trainwatch.exporters.contract` is what both (and the generators and the
remediation service) share. The direction is one-way: rank and contract code never import
node-side, remediation, generator or Ansible code, and the contract imports neither side.

Two checks, because each misses what the other sees: a fresh interpreter that imports every
rank-side module and lists what got loaded (catches an import hidden behind another package),
and a parse of every import statement in the source, function-local ones included (catches an
import on a code path the first check never runs).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIRST_PARTY_NODE_SIDE = ("trainwatch.exporters.node", "trainwatch.remediation", "ansible",
                         "alert_rules", "dashboards")
# the server-side packages the client install leaves out (issue 26); pynvml is not among them
# at run time only because torch imports it itself when it is installed
SERVER_SIDE = ("flask", "waitress", "werkzeug", "prometheus_client", "yaml", "requests",
               "ansible_runner", "bcrypt")
NOT_FOR_RANKS = (*FIRST_PARTY_NODE_SIDE, *SERVER_SIDE)
# serving.py (HTTP defaults every node-side server and remediation share) may use waitress
NOT_FOR_THE_CONTRACT = (*FIRST_PARTY_NODE_SIDE, "trainwatch.exporters.rank", "torch")

# The framework callbacks import their framework (transformers, lightning), which brings its
# own dependencies (requests, yaml): only their own import statements are checked (below).
FRAMEWORK_MODULES = ("trainwatch.exporters.rank.hf_callback",
                     "trainwatch.exporters.rank.lightning_callback")
LOAD_EVERY_RANK_MODULE = f"""
import importlib, json, pkgutil, sys
import trainwatch.exporters.rank
for info in pkgutil.walk_packages(trainwatch.exporters.rank.__path__, "trainwatch.exporters.rank."):
    if info.name not in {FRAMEWORK_MODULES!r}:
        importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


def _matches(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _imports(path: Path, package: str) -> set[str]:
    """Every module an import statement in `path` names, relative imports resolved."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join([*base, node.module] if node.module else base))
            else:
                found.add(node.module or "")
    return found


def _sources(package_dir: Path) -> list[Path]:
    return sorted(package_dir.rglob("*.py"))


def test_a_fresh_interpreter_loading_every_rank_module_loads_nothing_node_side() -> None:
    loaded = json.loads(subprocess.run(
        [sys.executable, "-c", LOAD_EVERY_RANK_MODULE], cwd=REPO, capture_output=True,
        text=True, check=True, timeout=300).stdout)
    assert "trainwatch.exporters.rank.client" in loaded
    assert "trainwatch.exporters.rank.logs.handler" in loaded
    assert [m for m in loaded if _matches(m, NOT_FOR_RANKS)] == []


@pytest.mark.parametrize(("package", "forbidden"), [
    ("exporters/rank", (*NOT_FOR_RANKS, "pynvml")),
    ("exporters/contract", NOT_FOR_THE_CONTRACT)])
def test_no_import_statement_points_the_wrong_way(package: str,
                                                  forbidden: tuple[str, ...]) -> None:
    wrong = {}
    for path in _sources(REPO / package):
        dotted = "trainwatch." + ".".join(path.relative_to(REPO).with_suffix("").parts)
        pkg = dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]
        bad = sorted(m for m in _imports(path, pkg.removesuffix(".__init__"))
                     if _matches(m, forbidden))
        if bad:
            wrong[str(path.relative_to(REPO))] = bad
    assert wrong == {}


def test_every_module_of_exporters_lives_in_one_of_the_three_parts() -> None:
    # a folder left with only __pycache__ (a checkout from before the move) holds no code
    top = {p.name for p in (REPO / "exporters").iterdir()
           if p.name != "__pycache__" and not p.name.startswith(".")
           and (p.is_file() or any(f.suffix != ".pyc" for f in p.rglob("*") if f.is_file()))}
    assert top == {"__init__.py", "py.typed", "rank", "node", "contract"}


def test_the_public_names_resolve_where_the_docs_import_them() -> None:
    import trainwatch.exporters.rank as rank

    for name in rank.__all__:
        value = getattr(rank, name)
        assert value.__module__.startswith("trainwatch.exporters.rank."), (name, value.__module__)
