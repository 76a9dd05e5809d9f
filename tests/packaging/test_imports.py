"""Issue 27, acceptance 2: the import graph of the first-party packages has no cycle, no module
only forwards names, and the rule generator loads no NVML code.

The graph is read from the source (every import statement, function-local ones included: a
cycle closed inside a function is still a cycle, it only fails later and on some code paths),
with the package __init__ each import runs first. Before: the rule and dashboard generators
imported their Kubernetes writers for their command lines while the writers imported the
generators; the fake NVML imported the module that loads it; and the torchrun elastic
scheduler imported the `ansible` action, whose package __init__ imported every action,
quarantine among them, which imports the schedulers.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("exporters", "remediation", "alert_rules", "dashboards", "scripts")
# The cycle check reads the whole tree's Python: the benchmarks and the tests import product
# code and each other (`from benchmarks.checkpoint import ...`, `from tests.support ...`), and a
# cycle among them fails as late and as partially as one in the product.
CYCLE_CHECKED = (*PACKAGES, "benchmarks", "tests")
# The folders the distribution installs under the one namespace (pyproject's package-dir).
INSTALLED = {"exporters": "trainwatch.exporters", "remediation": "trainwatch.remediation"}
# The public API users import (`from trainwatch.exporters.rank import TrainingMonitor`), resolved
# lazily so
# that importing one name does not load torch-side modules for the others (docs/training.md).
FORWARDING_ALLOWED = {"exporters/rank/__init__.py"}


def modules(repo: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted name -> source file of every first-party module (packages by their __init__)."""
    out = {}
    for package in packages:
        for path in sorted((repo / package).rglob("*.py")):
            parts = list(path.relative_to(repo).with_suffix("").parts)
            parts[0] = INSTALLED.get(parts[0], parts[0])
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _target(name: str, known: dict[str, Path]) -> str | None:
    """The first-party module an imported dotted name is, or the package that defines it."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _packages(module: str) -> set[str]:
    """The packages above a dotted module name."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The first-party modules `module` imports anywhere in its source, with the packages
    above each (importing a.b.c runs a.b's __init__ first), except the packages above
    `module` itself: Python has run those before the module's own code."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from a import b` imports the module a.b when there is one, else a name of a
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = _target(name, known)
            if target and target != module:
                found |= {target, *(_packages(target) - _packages(module) - {module})}
    return found & set(known)


def graph(repo: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    known = modules(repo, packages)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_cycles() -> None:
    assert cycles(graph(packages=CYCLE_CHECKED)) == []


# CONTRIBUTING.md's layout map, top to bottom: code imports only what is below it (what runs
# later or elsewhere never reaches back up; `exporters` itself holds the version, used by all).
LAYERS = ("scripts", "dashboards", "alert_rules", "trainwatch.remediation",
          "trainwatch.exporters.node", "trainwatch.exporters.rank", "trainwatch.exporters.contract",
          "trainwatch.exporters")


def layer(module: str) -> str:
    return next(name for name in LAYERS if module == name or module.startswith(name + "."))


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in edges.items() for t in targets
                  if LAYERS.index(layer(t)) < LAYERS.index(layer(m)))


def test_imports_point_down_the_layout_map() -> None:
    assert upward_imports(graph()) == []
    assert upward_imports({"trainwatch.exporters.contract.catalog":
                           {"trainwatch.remediation.store"},
                           "dashboards.panels": {"alert_rules.promql"}}) == [
        "trainwatch.exporters.contract.catalog -> trainwatch.remediation.store"]
    text = (REPO / "CONTRIBUTING.md").read_text()
    rows = [f"| `{name.removeprefix('trainwatch.').replace('.', '/')}/` |"
            for name in LAYERS[:-1]]
    assert sorted(rows, key=text.index) == rows, "the map's rows are in LAYERS' order"


def test_the_cycle_check_sees_function_level_and_from_imports(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "__init__.py").write_text("")
    (tmp_path / "scripts" / "a.py").write_text("from scripts.b import run\n")
    (tmp_path / "scripts" / "b.py").write_text("def run():\n    from scripts import a\n")
    (tmp_path / "scripts" / "c.py").write_text("from . import a\n")
    # a package whose __init__ imports a module that imports a sibling package's module, which
    # reaches back into the first package (its __init__ runs first): a cycle through the inits
    (tmp_path / "remediation" / "actions").mkdir(parents=True)
    (tmp_path / "remediation" / "schedulers").mkdir()
    (tmp_path / "remediation" / "__init__.py").write_text("")
    (tmp_path / "remediation" / "actions" / "__init__.py").write_text(
        "from trainwatch.remediation.actions import quarantine\n")
    (tmp_path / "remediation" / "actions" / "quarantine.py").write_text(
        "from trainwatch.remediation.schedulers import elastic\n")
    (tmp_path / "remediation" / "actions" / "ansible.py").write_text("")
    (tmp_path / "remediation" / "schedulers" / "__init__.py").write_text("")
    (tmp_path / "remediation" / "schedulers" / "elastic.py").write_text(
        "def drain():\n    from trainwatch.remediation.actions import ansible\n")
    assert cycles(graph(tmp_path)) == [
        ["scripts.a", "scripts.b"],
        ["trainwatch.remediation.actions", "trainwatch.remediation.actions.quarantine",
         "trainwatch.remediation.schedulers.elastic"]]


def _is_import(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.module != "__future__"
    if isinstance(node, ast.If):  # `if TYPE_CHECKING:` imports
        return all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in [*node.body, *node.orelse])
    return isinstance(node, ast.Import)


def _assigns_all(node: ast.stmt) -> bool:
    targets = (node.targets if isinstance(node, ast.Assign)
               else [node.target] if isinstance(node, ast.AnnAssign) else [])
    return [getattr(t, "id", None) for t in targets] == ["__all__"]


def _all(tree: ast.Module) -> list[str]:
    """The names a module's `__all__` lists (a literal, as this project writes it)."""
    for node in tree.body:
        if _assigns_all(node) and getattr(node, "value", None) is not None:
            return list(ast.literal_eval(node.value))  # type: ignore[attr-defined]
    return []


def forwarding(path: Path) -> list[str]:
    """How a module hands out names defined elsewhere as its own (a second spelling of them):
    a body of nothing but imports, a module `__getattr__` (PEP 562, lazy forwarding), imported
    names listed in `__all__`, or an import kept only to be re-exported (`noqa: F401`)."""
    source = path.read_text()
    tree = ast.parse(source, str(path))
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    body = [n for n in body
            if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    found = []
    if body and all(_is_import(n) or _assigns_all(n) for n in body):
        found.append("only imports")
    imported = {alias.asname or alias.name for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module != "__future__"
                for alias in n.names}
    if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
        found.append("module __getattr__")
    listed = sorted(set(_all(tree)) & imported)
    if listed:
        found.append(f"__all__ lists imported names {listed}")
    lines = source.splitlines()
    reexported = sorted(alias.asname or alias.name for n in tree.body
                        if isinstance(n, ast.ImportFrom) and n.module
                        and n.module.split(".")[0] in (*PACKAGES, "trainwatch")
                        and "noqa: F401" in lines[n.lineno - 1]
                        for alias in n.names)
    if reexported:
        found.append(f"re-exports {reexported}")
    return found


def pass_through_modules(repo: Path = REPO) -> dict[str, list[str]]:
    """Module file -> how it forwards names, for every first-party module but the exception."""
    out = {}
    for path in modules(repo).values():
        rel = str(path.relative_to(repo))
        if rel not in FORWARDING_ALLOWED and (how := forwarding(path)):
            out[rel] = how
    return out


def test_no_module_forwards_names() -> None:
    assert pass_through_modules() == {}


def test_the_forwarding_check_knows_a_forwarder_from_a_module(tmp_path: Path) -> None:
    (tmp_path / "alert_rules").mkdir()
    cases = {
        "__init__.py": '"""A package with only a docstring forwards nothing."""\n',
        "names.py": '"""Old spelling."""\nfrom __future__ import annotations\n\n'
                    "from trainwatch.exporters.contract.catalog import GPU_UP, GPU_TEMPERATURE\n",
        "lazy.py": "X = 1\n\n\ndef __getattr__(name):\n"
                   "    from trainwatch.exporters.contract import catalog\n"
                   "    return getattr(catalog, name)\n",
        "listed.py": "from trainwatch.exporters.contract.identity import detect_job\n\n\n"
                     "def rank_log_path():\n    return detect_job()\n\n\n"
                     '__all__ = ["detect_job", "rank_log_path"]\n',
        "kept.py": "from trainwatch.exporters.node.gpu.nvml_source import load_nvml"
                   "  # noqa: F401\n\nX = 1\n",
        "real.py": "from trainwatch.exporters.contract import catalog\n\n"
                   "UP = catalog.GPU_UP + '_x'\n"
                   '__all__ = ["UP"]\n',
    }
    for name, text in cases.items():
        (tmp_path / "alert_rules" / name).write_text(text)
    assert pass_through_modules(tmp_path) == {
        "alert_rules/kept.py": ["re-exports ['load_nvml']"],
        "alert_rules/lazy.py": ["module __getattr__"],
        "alert_rules/listed.py": ["__all__ lists imported names ['detect_job']"],
        "alert_rules/names.py": ["only imports"]}


LOADED_BY_THE_RULE_GENERATOR = """
import json, sys
from alert_rules import generate
from alert_rules.config import CONFIG_PATH, load_profiles
for profile in load_profiles(CONFIG_PATH):
    generate.render(profile)
print(json.dumps(sorted(sys.modules)))
"""


def test_the_rule_generator_loads_no_nvml_and_no_node_side_exporter() -> None:
    loaded = json.loads(subprocess.run(
        [sys.executable, "-c", LOADED_BY_THE_RULE_GENERATOR], cwd=REPO, capture_output=True,
        text=True, check=True, timeout=300).stdout)
    assert "alert_rules.gpu_source" in loaded
    assert [m for m in loaded if m.split(".")[0] == "pynvml"
            or m == "trainwatch.exporters.node" or m.startswith("trainwatch.exporters.node.")] == []
