"""Issue 26, acceptance 5: every generated dashboard type-checks against Grafana's own dashboard
schema, `@grafana/schema` from npm (pinned with TypeScript in dashboards/schema/package.json and
its lockfile; scripts/setup.sh runs `npm ci` there).

Each dashboard's JSON becomes a TypeScript object literal checked with `satisfies Dashboard`
under `tsc --strict`, so a field the schema does not define (the SDK's leftovers: `auto`,
`auto_count`, `auto_min` on every variable, a zero UUID as variable `id`, `style`) is an error,
as is a wrong type. On the code before the fix every dashboard failed on those leftovers.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.dashboards.dashboard_files import DASHBOARDS_DIR, load_all

SCHEMA_DIR = DASHBOARDS_DIR / "schema"
TSC = SCHEMA_DIR / "node_modules" / ".bin" / "tsc"
TSCONFIG = {"compilerOptions": {"strict": True, "noEmit": True, "module": "nodenext",
                                "moduleResolution": "nodenext", "target": "es2022",
                                "skipLibCheck": True}}


# Fields of an annotation query that belong to its data source's query model, which
# @grafana/schema does not carry (it types an annotation's query as the generic DataQuery and
# has no Prometheus query type; Grafana's Prometheus data source reads `expr` from the
# annotation). They are taken out before the type check and checked as PromQL instead
# (tests/dashboards/test_queries_parse.py, annotation queries).
DATASOURCE_QUERY_FIELDS = {"prometheus": ("expr",)}


def without_datasource_query_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of the dashboard without its annotations' data-source-specific query fields."""
    doc = json.loads(json.dumps(doc))
    for annotation in doc.get("annotations", {}).get("list", []):
        kind = (annotation.get("datasource") or {}).get("type")
        for field in DATASOURCE_QUERY_FIELDS.get(kind, ()):
            assert isinstance(annotation.pop(field, ""), str), (annotation.get("name"), field)
    return doc


def typecheck(dashboards: dict[str, dict[str, Any]], workdir: Path) -> str:
    """tsc's diagnostics for the dashboards (empty: all valid), one .ts file per dashboard."""
    if not TSC.exists():
        pytest.fail(f"{TSC} missing: run scripts/setup.sh --tests (npm ci in {SCHEMA_DIR})")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "node_modules").symlink_to(SCHEMA_DIR / "node_modules")
    files = []
    for name, doc in dashboards.items():
        path = workdir / (Path(name).stem.replace("-", "_") + ".ts")
        literal = json.dumps(without_datasource_query_fields(doc), indent=1)
        path.write_text("import type { Dashboard } from '@grafana/schema';\n"
                        f"export const dashboard = {literal} "
                        "satisfies Dashboard;\n")
        files.append(path.name)
    (workdir / "tsconfig.json").write_text(json.dumps({**TSCONFIG, "files": files}))
    done = subprocess.run([str(TSC), "-p", str(workdir / "tsconfig.json")],
                          capture_output=True, text=True, timeout=300, cwd=workdir, check=False)
    return (done.stdout + done.stderr).strip()


def test_the_schema_and_compiler_are_the_pinned_ones() -> None:
    pinned = json.loads((SCHEMA_DIR / "package.json").read_text())["devDependencies"]
    lock = json.loads((SCHEMA_DIR / "package-lock.json").read_text())["packages"]
    for package, version in pinned.items():
        assert lock[f"node_modules/{package}"]["version"] == version
        installed = SCHEMA_DIR / "node_modules" / package / "package.json"
        assert json.loads(installed.read_text())["version"] == version, package


def test_every_dashboard_type_checks_against_grafanas_schema(tmp_path: Path) -> None:
    assert typecheck(load_all(), tmp_path) == ""


@pytest.mark.parametrize(("where", "mutate"), [
    ("an SDK leftover on a variable",
     lambda d: d["templating"]["list"][0].update(auto=False)),
    ("style", lambda d: d.update(style="dark")),
    ("a wrong type", lambda d: d.update(refresh=30)),
    ("an unknown panel field", lambda d: d["panels"][0].update(colour="red")),
    ("an unknown annotation field", lambda d: d.setdefault("annotations", {}).setdefault(
        "list", []).append({"datasource": {"type": "prometheus", "uid": "x"}, "enable": True,
                            "iconColor": "red", "name": "n", "colour": "red"})),
])
def test_the_check_catches_what_the_schema_forbids(tmp_path: Path, where: str, mutate: Any
                                                   ) -> None:
    name, doc = next(iter(load_all().items()))
    mutate(doc)
    assert "error TS" in typecheck({name: doc}, tmp_path), where
