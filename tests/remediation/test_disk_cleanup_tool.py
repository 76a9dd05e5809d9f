"""remediation.tools.disk_cleanup on real directory trees: retention, dry-run, symlinks, roots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

DAY = 86400


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remediation.tools.disk_cleanup", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def checkpoints(root: Path, spec: list[tuple[int, bool]]) -> Path:
    ckpt = root / "ckpt"
    ckpt.mkdir(parents=True)
    entries = []
    for step, healthy in spec:
        (ckpt / f"s{step}.pt").write_bytes(b"c" * 100)
        entries.append({"step": step, "healthy": healthy, "loss": 0.5, "path": f"s{step}.pt"})
    (ckpt / "manifest.json").write_text(json.dumps(entries))  # bare-list manifest form
    return ckpt


def test_dry_run_prints_plan_and_bytes_and_changes_nothing(tmp_path: Path) -> None:
    ckpt = checkpoints(tmp_path, [(1, True), (2, False), (3, False), (4, False)])
    before = sorted(p.name for p in ckpt.iterdir())
    out = run_tool("--allowed-root", str(tmp_path), "--checkpoints", str(ckpt), "--keep", "2",
                   "--dry-run")
    assert out.returncode == 0, out.stderr
    assert f"PLAN {ckpt / 's2.pt'} (100 bytes)" in out.stdout
    assert "would free 100 bytes" in out.stdout  # s1 is the newest healthy: kept
    assert sorted(p.name for p in ckpt.iterdir()) == before


def test_apply_keeps_newest_n_and_newest_healthy(tmp_path: Path) -> None:
    ckpt = checkpoints(tmp_path, [(1, True), (2, True), (3, False), (4, False), (5, False)])
    out = run_tool("--allowed-root", str(tmp_path), "--checkpoints", str(ckpt), "--keep", "2",
                   "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["bytes_freed"] == 200
    assert sorted(p.name for p in ckpt.glob("*.pt")) == ["s2.pt", "s4.pt", "s5.pt"]
    assert [e["step"] for e in json.loads((ckpt / "manifest.json").read_text())] == [2, 4, 5]


def test_symlinks_are_never_followed_or_removed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "old.log"
    victim.write_text("keep me")
    old = time.time() - 30 * DAY
    os.utime(victim, (old, old))
    root = tmp_path / "root"
    logs = root / "logs"
    logs.mkdir(parents=True)
    (logs / "file-link.log").symlink_to(victim)
    (logs / "dir-link").symlink_to(outside, target_is_directory=True)
    ckpt = checkpoints(root, [(1, False), (2, False)])
    (ckpt / "s0.pt").symlink_to(victim)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest += [{"step": 0, "path": "s0.pt"}, {"step": -1, "path": "../../outside/old.log"}]
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    out = run_tool("--allowed-root", str(root), "--logs", str(logs), "--checkpoints", str(ckpt),
                   "--keep", "1", "--json")
    assert out.returncode == 0, out.stderr
    assert victim.read_text() == "keep me"
    assert (logs / "file-link.log").is_symlink() and (logs / "dir-link").is_symlink()
    assert (ckpt / "s0.pt").is_symlink()
    assert [Path(r["path"]).name for r in json.loads(out.stdout)["remove"]] == ["s1.pt"]


@pytest.mark.parametrize("extra", [["--logs", "/etc"], ["--cache", "relative/dir"]])
def test_directories_outside_allowed_roots_are_refused(tmp_path: Path, extra: list[str]) -> None:
    out = run_tool("--allowed-root", str(tmp_path), *extra)
    assert out.returncode == 2 and "not under an allowed root" in out.stderr


def test_symlinked_directory_escaping_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "logs").symlink_to("/etc", target_is_directory=True)
    out = run_tool("--allowed-root", str(root), "--logs", str(root / "logs"))
    assert out.returncode == 2


def test_reads_and_rewrites_the_real_checkpoint_managers_manifest(tmp_path: Path) -> None:
    """Against exporters.training.checkpoint: after cleanup the manager still reads its
    manifest, and its rollback target (the newest healthy checkpoint) is still there."""
    torch = pytest.importorskip("torch")
    from exporters.training.checkpoint import CheckpointManager

    ckpt = tmp_path / "ckpt"
    manager = CheckpointManager(ckpt, torch.nn.Linear(2, 2), keep=10, asynchronous=False)
    for step, loss in ((10, 1.0), (20, 0.9), (30, float("nan")), (40, float("nan")),
                       (50, float("nan"))):
        manager.save(step, loss=loss)
    manager.wait()
    out = run_tool("--allowed-root", str(tmp_path), "--checkpoints", str(ckpt), "--keep", "2",
                   "--json")
    assert out.returncode == 0, out.stderr
    entries = manager.manifest()
    assert [e["step"] for e in entries] == [20, 40, 50]
    assert manager.newest_healthy()["step"] == 20
    # only the checkpoints the manifest still names are left on disk
    assert sorted(p.name for p in ckpt.glob("step-*")) == sorted(e["dir"] for e in entries)
    assert manager.rollback().step == 20
    manager.close()


def test_entry_without_an_integer_step_is_kept_not_a_crash(tmp_path: Path) -> None:
    ckpt = checkpoints(tmp_path, [(1, False), (2, False), (3, False)])
    entries = json.loads((ckpt / "manifest.json").read_text())
    (ckpt / "odd.pt").write_bytes(b"c" * 100)
    entries.append({"step": None, "healthy": False, "path": "odd.pt"})
    (ckpt / "manifest.json").write_text(json.dumps(entries))
    out = run_tool("--allowed-root", str(tmp_path), "--checkpoints", str(ckpt), "--keep", "1",
                   "--json")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in ckpt.glob("*.pt")) == ["odd.pt", "s3.pt"]
