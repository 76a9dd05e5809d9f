"""The trainwatch.stack collection as `ansible-galaxy collection build` packs it and
`ansible-galaxy collection install` installs it (the suite's one build, the
`ansible_collection` fixture): the version is the Python package's, what the repository
generates is inside it byte for byte from its one source, and the repository's own
inventories and scenario are not."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import yaml

import trainwatch.exporters
from scripts import collection, project_wheel
from tests.ansible.runner import ANSIBLE, REPO


def installed(path: Path) -> Path:
    return path / "ansible_collections" / "trainwatch" / "stack"


def test_the_collection_carries_the_packages_version(ansible_collection: Path) -> None:
    manifest = json.loads((installed(ansible_collection) / "MANIFEST.json").read_text())
    assert manifest["collection_info"]["namespace"] == "trainwatch"
    assert manifest["collection_info"]["name"] == "stack"
    assert manifest["collection_info"]["version"] == trainwatch.exporters.__version__
    assert yaml.safe_load((ANSIBLE / "galaxy.yml").read_text())["version"] == \
        trainwatch.exporters.__version__


def test_the_build_refuses_a_galaxy_version_other_than_the_packages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collection, "__version__", "99.0.0")
    with pytest.raises(collection.BuildError, match=r"99\.0\.0"):
        collection.build(tmp_path)
    assert not list(tmp_path.iterdir())


def test_generated_files_are_inside_it_from_their_one_source(ansible_collection: Path) -> None:
    root = installed(ansible_collection)
    pairs = [(REPO / "exporters/contract/contract.json", "plugins/lookup/contract.json"),
             (REPO / "alert_rules/alertmanager.yml.j2",
              "roles/alertmanager/templates/alertmanager.yml.j2")]
    for profile in ("demo", "dcgm", "production"):
        pairs += [(p, f"roles/prometheus/files/rules/{profile}/{p.name}")
                  for p in (REPO / "alert_rules/generated" / profile).glob("*.yml")]
    pairs += [(p, f"roles/grafana/files/dashboards/{p.name}")
              for p in (REPO / "dashboards/generated").glob("*.json")]
    pairs += [(p, f"roles/remediation/files/playbooks/{p.name}")
              for p in (ANSIBLE / "playbooks/remediation").glob("*.yml")]
    assert len(pairs) > 20
    for source, inside in pairs:
        assert (root / inside).read_bytes() == source.read_bytes(), inside
    # the repository's own inventories and test scenario stay out
    assert not (root / "inventories").exists() and not (root / "molecule").exists()
    # and nothing generated is copied into the source tree
    assert not (ANSIBLE / "plugins/lookup/contract.json").exists()
    assert not (ANSIBLE / "roles/prometheus/files").exists()


def test_it_carries_the_projects_wheel_built_from_the_tree(ansible_collection: Path) -> None:
    """The wheel the _common role installs by default (trainwatch_project_source: wheel) is the
    project of the tree the collection was built from, at the collection's version."""
    wheels = sorted((installed(ansible_collection) / collection.WHEELS).glob("*.whl"))
    assert [w.name for w in wheels] == [
        f"trainwatch_gpu-{trainwatch.exporters.__version__}-py3-none-any.whl"]
    with zipfile.ZipFile(wheels[0]) as wheel:
        for inside, source in (("trainwatch/exporters/__init__.py", "exporters/__init__.py"),
                               ("trainwatch/exporters/contract/contract.json",
                                "exporters/contract/contract.json"),
                               ("trainwatch/remediation/server.py", "remediation/server.py")):
            assert wheel.read(inside) == (REPO / source).read_bytes(), inside
        assert not [n for n in wheel.namelist() if "__pycache__" in n or n.endswith(".pyc")]
    # and, like every generated file, it is not copied into the source tree
    assert not (ANSIBLE / "roles/_common/files").exists()


def test_the_same_tree_gives_the_same_wheel(tmp_path: Path) -> None:
    first = project_wheel.build(tmp_path / "a")
    second = project_wheel.build(tmp_path / "b")
    assert first.name == second.name
    assert first.read_bytes() == second.read_bytes()
