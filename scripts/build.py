"""The one build command: every generated file of the repository, from its one source.

    python -m scripts.build            # rewrite what is stale; prints each file it wrote
    python -m scripts.build --check    # write nothing; exit 1 naming the stale files
    python -m scripts.build --overlay ~/trainwatch/overlay.yml --out ~/trainwatch/build

The steps run in dependency order (STEPS): alert rules, their PrometheusRule objects,
dashboards, their ConfigMaps, the Logstash failure patterns, the docs' metric and alert
tables, the numbers the docs quote (`<!-- fact -->`). The steps render into memory first (a
later step reads an earlier one's output: the metric tables fill sections of pages the doc
facts rewrite too), so one that fails writes nothing, and `--check` compares the same texts
with the tree. The doc facts run after the other files are written: they count what the whole
tree holds (the test count, and tests are parametrized over generated files).

With a user overlay (alert_rules/overlay.py) only what the overlay changes is built, under
--out at the same relative paths as in the repository, plus the Alertmanager receivers as the
alertmanager role's variables (ALERTMANAGER_VARS, for `ansible-playbook -e @FILE`); --out must
lie outside the repository, whose files stay the shipped defaults the tests compare with.

Not installed (the generators live beside the repository's sources); the tests run it in a copy
of the tree and fail when `git status` is not clean afterwards (tests/test_build.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from alert_rules import generate as rules
from alert_rules import kubernetes as rule_objects
from alert_rules import overlay as overlays
from alert_rules.config import CONFIG_PATH, ConfigError, load_profiles
from dashboards import generate as dashboards
from dashboards import kubernetes as dashboard_maps
from scripts import doc_facts, metric_docs
from trainwatch.exporters.node.logs import logstash

ROOT = Path(__file__).resolve().parents[1]
# Every generated file's place, relative to the repository root (or to --out): here only.
RULES_DIR = Path("alert_rules", "generated")  # <profile>/*.yml
RULE_OBJECTS_DIR = RULES_DIR / "kubernetes"  # <profile>-prometheusrule.yaml
DASHBOARDS_DIR = Path("dashboards", "generated")  # <stem>.json
DASHBOARD_MAPS = DASHBOARDS_DIR / "kubernetes" / "trainwatch-dashboards.yaml"
LOGSTASH_VARS = Path("ansible", "roles", "logstash", "vars", "main.yml")
ALERTMANAGER_VARS = Path("alertmanager-vars.yml")  # overlay builds only: nothing committed


@dataclass
class Tree:
    """The files a build writes, held in memory until every step has rendered: path relative
    to `root` -> new text, and the generated files that are no longer generated."""

    root: Path
    files: dict[Path, str] = field(default_factory=dict)
    removed: set[Path] = field(default_factory=set)

    def read(self, rel: Path) -> str:
        """A file as the build leaves it: an earlier step's output, else the tree's."""
        return self.files[rel] if rel in self.files else (self.root / rel).read_text()

    def put(self, rel: Path, text: str) -> None:
        self.files[rel] = text
        self.removed.discard(rel)

    def folder(self, rel: Path, files: Mapping[str, str], stale: str) -> None:
        """A folder a step owns: its files, and the removal of those matching the glob `stale`
        that it no longer generates (a renamed output must not linger and be deployed)."""
        for old in sorted((self.root / rel).glob(stale)):
            if old.name not in files:
                self.removed.add(rel / old.name)
        for name, text in files.items():
            self.put(rel / name, text)

    def stale(self) -> list[Path]:
        """The paths whose text on disk differs from the build's, or that should be gone."""
        out = [rel for rel, text in self.files.items()
               if not (self.root / rel).is_file() or (self.root / rel).read_text() != text]
        return sorted(out + [rel for rel in self.removed if (self.root / rel).exists()])

    def write(self) -> list[Path]:
        """Write the stale files and remove the dropped ones; the paths touched, in order."""
        changed = self.stale()
        for rel in changed:
            path = self.root / rel
            if rel in self.removed:
                path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.files[rel])
        return changed


@dataclass(frozen=True)
class Step:
    """One kind of generated file: what it is made from, and how."""

    name: str
    source: str
    build: Callable[[Tree, overlays.Overlay], None]
    overlay: bool  # part of a user's overlay build (the overlay changes it)
    # Reads the whole tree as written, not only its own sources: the doc facts count the tests
    # pytest collects, and tests are parametrized over generated files. Such a step runs after
    # the others' files are written.
    last: bool = False


def _rules(tree: Tree, overlay: overlays.Overlay) -> None:
    profiles = load_profiles(CONFIG_PATH, overlay.rule_values())
    for profile in profiles:
        tree.folder(RULES_DIR / profile.name, rules.render(profile), "*.yml")


def _rule_objects(tree: Tree, overlay: overlays.Overlay) -> None:
    tree.folder(RULE_OBJECTS_DIR, rule_objects.render(overlay=overlay), "*-prometheusrule.yaml")


def _dashboards(tree: Tree, overlay: overlays.Overlay) -> None:
    tree.folder(DASHBOARDS_DIR, dashboards.render_dashboards(), "*.json")


def _dashboard_maps(tree: Tree, overlay: overlays.Overlay) -> None:
    tree.put(DASHBOARD_MAPS, dashboard_maps.render(overlay=overlay))


def _alertmanager_vars(tree: Tree, overlay: overlays.Overlay) -> None:
    if overlay.source is not None:  # the shipped receivers are the role's defaults
        tree.put(ALERTMANAGER_VARS,
                 yaml.safe_dump(overlays.ansible_vars(overlay), sort_keys=False))


def _logstash(tree: Tree, overlay: overlays.Overlay) -> None:
    tree.put(LOGSTASH_VARS, logstash.render())


def _metric_tables(tree: Tree, overlay: overlays.Overlay) -> None:
    for kind, (page, build) in metric_docs.SECTIONS.items():
        tree.put(page, metric_docs.render(tree.read(page), kind, build()))


def _doc_facts(tree: Tree, overlay: overlays.Overlay) -> None:
    pages = [page.relative_to(tree.root) for page in doc_facts.pages(tree.root)]
    used = {name for page in pages for name, _ in doc_facts.FACT.findall(tree.read(page))}
    values = {name: doc_facts.FACTS[name]() for name in sorted(used) if name in doc_facts.FACTS}
    for page in pages:
        tree.put(page, doc_facts.rewrite(tree.read(page), values, str(page)))


STEPS: tuple[Step, ...] = (
    Step("alert rules", "alert_rules/config.yml and alert_rules/*.py", _rules, True),
    Step("PrometheusRule objects", "the alert rules", _rule_objects, True),
    Step("dashboards", "dashboards/*.py", _dashboards, True),
    Step("dashboard ConfigMaps", "the dashboards", _dashboard_maps, True),
    Step("Alertmanager receivers", "the overlay's receivers", _alertmanager_vars, True),
    Step("Logstash failure patterns", "exporters/node/logs/patterns.py", _logstash, False),
    Step("metric and alert tables", "exporters/contract/catalog.py, alert_rules/config.yml",
         _metric_tables, False),
    Step("doc facts", "scripts/doc_facts.py FACTS", _doc_facts, False, last=True),
)


def plan(root: Path = ROOT, overlay: overlays.Overlay | None = None,
         only: Iterable[str] | None = None) -> Tree:
    """Render every step (or those named in `only`) into a Tree over `root`; writes nothing.
    With an overlay, only the steps the overlay changes. (A `last` step sees the files on
    disk: `main` writes the others first.)"""
    overlay = overlay or overlays.Overlay()
    names = set(only) if only is not None else None
    unknown = (names or set()) - {s.name for s in STEPS}
    if unknown:
        raise ValueError(f"unknown build steps {sorted(unknown)}")
    tree = Tree(root)
    for step in STEPS:
        if (names is None or step.name in names) and (overlay.source is None or step.overlay):
            step.build(tree, overlay)
    return tree


def _outside(out: Path, root: Path) -> Path:
    out, root = out.resolve(), root.resolve()
    if out == root or root in out.parents:
        raise ConfigError(f"with an overlay, write with --out to a folder outside {root}: "
                          "the files there are the shipped defaults")
    return out


def _written(tree: Tree, shown: Path | None) -> None:
    """Write a planned tree and print what changed (under `shown`, the --out folder, if any)."""
    for rel in tree.write():
        print(("removed " if rel in tree.removed else "") + str(shown / rel if shown else rel))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="steps, in order:\n" + "\n".join(f"  {s.name} (from {s.source})" for s in STEPS))
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming the stale files")
    parser.add_argument("--overlay", type=Path, default=None,
                        help=f"user overlay (alert_rules/overlay.py; default ${overlays.ENV})")
    parser.add_argument("--out", type=Path, default=None,
                        help="with an overlay: the folder its build goes to")
    args = parser.parse_args(argv)
    first = [s.name for s in STEPS if not s.last or args.check]
    try:
        overlay = overlays.load(args.overlay)
        if (overlay.source is None) != (args.out is None):
            raise ConfigError("--out goes with an overlay (--overlay or $"
                              f"{overlays.ENV}), and an overlay with --out")
        root = ROOT if args.out is None else _outside(args.out, ROOT)
        tree = plan(root, overlay, first)
        if args.check:
            stale = tree.stale()
            for rel in stale:
                print(f"stale: {rel} (run python -m scripts.build)", file=sys.stderr)
            return 1 if stale else 0
        _written(tree, args.out and root)
        _written(plan(root, overlay, [s.name for s in STEPS if s.name not in first]),
                 args.out and root)
    except (ConfigError, ValueError, KeyError) as exc:  # KeyError: a page names no known fact
        print(f"scripts.build: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
