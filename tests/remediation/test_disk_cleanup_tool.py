"""trainwatch.exporters.node.tools.disk_cleanup on real directory trees: retention, dry-run,
symlinks,
roots."""

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
    return subprocess.run([sys.executable, "-m",
                           "trainwatch.exporters.node.tools.disk_cleanup", *args],
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
    """Against trainwatch.exporters.rank.checkpoint: after cleanup the manager still reads its
    manifest, and its rollback target (the newest healthy checkpoint) is still there."""
    torch = pytest.importorskip("torch")
    from trainwatch.exporters.rank.checkpoint import CheckpointManager

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


# --- Issue 25 items 1 and 4: the path re-verified at deletion, the manifest kept usable --------

def _old(path: Path) -> None:
    old = time.time() - 30 * DAY
    os.utime(path, (old, old), follow_symlinks=False)


def test_directory_swapped_for_a_symlink_after_planning_deletes_nothing_outside(
        tmp_path: Path) -> None:
    """Between plan and apply a directory inside the root (and then the log dir itself) is
    replaced by a symlink to a tree outside every root holding files of the same names: apply
    walks down from the root with O_NOFOLLOW and stops there. On the code before the fix the
    deletion went by path and removed the files outside the root."""
    from trainwatch.exporters.node.tools import disk_cleanup

    root = tmp_path / "root"
    outside = tmp_path / "outside"
    for base in (root / "logs", outside):
        (base / "sub").mkdir(parents=True)
        for rel in ("sub/old.log", "top.log"):
            (base / rel).write_text("x")
            _old(base / rel)
    roots = [Path(os.path.realpath(root))]
    plan = disk_cleanup.Plan(dry_run=False)
    disk_cleanup.plan_old_files(Path(os.path.realpath(root / "logs")), 7, "log", roots, plan)
    assert sorted(Path(r["path"]).name for r in plan.remove) == ["old.log", "top.log"]
    (root / "logs" / "sub").rename(root / "sub.moved")
    (root / "logs" / "sub").symlink_to(outside / "sub", target_is_directory=True)
    disk_cleanup.apply(plan)
    assert (outside / "sub" / "old.log").exists()
    assert (root / "sub.moved" / "old.log").exists()  # moved away: not where the plan saw it
    assert not (root / "logs" / "top.log").exists()  # the untouched part still cleaned
    assert any("sub" in e and "not followed" in e for e in plan.errors), plan.errors

    # the allowlisted log directory itself swapped for a symlink
    (root / "logs" / "top.log").write_text("x")
    _old(root / "logs" / "top.log")
    plan = disk_cleanup.Plan(dry_run=False)
    disk_cleanup.plan_old_files(Path(os.path.realpath(root / "logs")), 7, "log", roots, plan)
    (root / "logs").rename(root / "logs.moved")
    (root / "logs").symlink_to(outside, target_is_directory=True)
    disk_cleanup.apply(plan)
    assert (outside / "top.log").exists() and (outside / "sub" / "old.log").exists()
    assert plan.bytes_freed == 0


def test_checkpoint_dir_swapped_for_a_symlink_after_planning_is_not_followed(
        tmp_path: Path) -> None:
    """The same race on the checkpoint side: neither the manifest rewrite nor the slot
    removal goes through the swapped directory."""
    from trainwatch.exporters.node.tools import disk_cleanup

    root = tmp_path / "root"
    ckpt = checkpoints(root, [(1, False), (2, False), (3, False)])
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("s1.pt", "s2.pt", "s3.pt", "manifest.json"):
        (outside / name).write_bytes((ckpt / name).read_bytes())
    roots = [Path(os.path.realpath(root))]
    plan = disk_cleanup.Plan(dry_run=False)
    disk_cleanup.plan_checkpoints(Path(os.path.realpath(ckpt)), 1, roots, plan)
    assert len(plan.remove) == 2
    manifest_before = (outside / "manifest.json").read_text()
    ckpt.rename(root / "ckpt.moved")
    ckpt.symlink_to(outside, target_is_directory=True)
    disk_cleanup.apply(plan)
    assert sorted(p.name for p in outside.iterdir()) == ["manifest.json", "s1.pt", "s2.pt",
                                                         "s3.pt"]
    assert (outside / "manifest.json").read_text() == manifest_before


def test_a_file_replaced_after_planning_is_not_deleted(tmp_path: Path) -> None:
    """Apply deletes only the entry the plan saw (device and inode), not a new file that
    took its name (a fresh log after rotation)."""
    from trainwatch.exporters.node.tools import disk_cleanup

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "app.log").write_text("old")
    _old(logs / "app.log")
    plan = disk_cleanup.Plan(dry_run=False)
    disk_cleanup.plan_old_files(Path(os.path.realpath(logs)), 7, "log",
                                [Path(os.path.realpath(tmp_path))], plan)
    (logs / "app.log").rename(logs / "app.log.1")
    (logs / "app.log").write_text("fresh")
    disk_cleanup.apply(plan)
    assert (logs / "app.log").read_text() == "fresh"


def test_manifest_keeps_its_owner_group_and_mode(tmp_path: Path) -> None:
    """Cleanup runs as root; the training job owns its manifest. On the code before the fix
    the rewrite left it root-owned, mode 0600, and the job could not read it."""
    ckpt = checkpoints(tmp_path, [(1, False), (2, False), (3, False)])
    manifest = ckpt / "manifest.json"
    manifest.chmod(0o640)
    owner = (12345, 12346) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    os.chown(manifest, *owner)
    out = run_tool("--allowed-root", str(tmp_path), "--checkpoints", str(ckpt), "--keep", "1",
                   "--json")
    assert out.returncode == 0, out.stderr
    assert [e["step"] for e in json.loads(manifest.read_text())] == [3]
    st = manifest.stat()
    assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (*owner, oct(0o640))
    assert not list(ckpt.glob(".*.tmp"))


def test_a_slot_named_by_a_kept_entry_is_never_deleted(tmp_path: Path) -> None:
    """Two entries name one slot (a ring of slots, or a step saved again after a rollback):
    the old entry goes, the slot stays while the kept entry names it. On the code before the
    fix the slot was deleted and the kept entry pointed at nothing."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    entries = []
    for step, name in ((1, "slot-a"), (2, "s2"), (3, "s3"), (4, "slot-a")):
        (ckpt / name).write_bytes(b"c" * 100)
        entries.append({"step": step, "healthy": False, "path": name})
    (ckpt / "manifest.json").write_text(json.dumps(entries))
    out = run_tool("--allowed-root", str(tmp_path), "--checkpoints", str(ckpt), "--keep", "2",
                   "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [Path(r["path"]).name for r in report["remove"]] == ["s2"]
    assert sorted(p.name for p in ckpt.iterdir()) == ["manifest.json", "s3", "slot-a"]
    assert [e["step"] for e in json.loads((ckpt / "manifest.json").read_text())] == [3, 4]


def test_a_duplicated_entry_keeps_the_copy_that_is_kept(tmp_path: Path) -> None:
    """Two identical entries, one kept and one dropped: the manifest keeps one of them (the
    rewrite drops as many entries as were planned, not every entry that looks the same)."""
    ckpt = checkpoints(tmp_path, [(1, False), (2, False)])
    entries = json.loads((ckpt / "manifest.json").read_text())
    (ckpt / "manifest.json").write_text(json.dumps([*entries, entries[-1]]))
    out = run_tool("--allowed-root", str(tmp_path), "--checkpoints", str(ckpt), "--keep", "1",
                   "--json")
    assert out.returncode == 0, out.stderr
    assert [e["step"] for e in json.loads((ckpt / "manifest.json").read_text())] == [2]
    assert sorted(p.name for p in ckpt.glob("*.pt")) == ["s2.pt"]
