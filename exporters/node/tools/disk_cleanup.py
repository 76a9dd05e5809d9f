"""Plan (and with --apply, carry out) a disk cleanup under allowlisted roots only.

    python -m trainwatch.exporters.node.tools.disk_cleanup --allowed-root /data \
        --checkpoints /data/ckpt --logs /data/logs --cache /data/cache \
        --keep 3 --max-age-days 7 [--dry-run] [--json]

Rules, in the order they protect data:
* every directory given must resolve (realpath) inside an --allowed-root, else exit 2;
* symlinks are never followed and never removed (os.walk(followlinks=False), lstat);
* every deletion and the manifest rewrite re-verify the whole path when they happen, not only
  when the plan was made: starting from a handle on the allowed root, each directory on the
  way is opened relative to its parent with O_NOFOLLOW|O_DIRECTORY, and the file is unlinked
  (or the tree removed) relative to the last handle, and only if it is still the file (device
  and inode) the plan saw. A directory swapped for a symlink between plan and apply (to point
  outside every root) stops that deletion with an error; nothing outside the root is touched;
* checkpoints: a directory with a `manifest.json` (the training checkpoint manager's format:
  entries with `step`, `loss`, `healthy` and a file name) keeps the newest N entries by step and
  the newest healthy one; only files/dirs named by removed entries are deleted, never one that
  a kept entry also names (two entries may share a slot), and the manifest is rewritten
  atomically without them, keeping its owner, group and mode (the training job that owns it
  must still read it). Files the manifest does not name are kept.
* logs and caches: regular files older than --max-age-days are removed.
The plan (paths, reasons, bytes to free) is printed as JSON; --dry-run changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainwatch.exporters.contract.atomic_file import atomic_write_json

MANIFEST = "manifest.json"
NAME_KEYS = ("dir", "path", "file", "filename", "name")  # "dir": the DCP checkpoints


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Plan:
    dry_run: bool
    remove: list[dict[str, Any]] = field(default_factory=list)
    keep: list[dict[str, Any]] = field(default_factory=list)
    manifests: dict[str, list[Any]] = field(default_factory=dict)  # path -> steps kept
    errors: list[str] = field(default_factory=list)
    bytes_to_free: int = 0
    bytes_freed: int = 0
    # Not reported: what apply() re-verifies. path -> (allowed root, device, inode) of each
    # planned removal; manifest path -> (root, the (name, step) pairs of the entries dropped).
    where: dict[str, tuple[Path, int, int]] = field(default_factory=dict)
    dropped: dict[str, tuple[Path, list[tuple[str, Any]]]] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        out = asdict(self)
        for private in ("where", "dropped"):
            out.pop(private)
        out["manifests"] = sorted(self.manifests)
        return out


def _root_of(path: Path, roots: list[Path]) -> Path | None:
    """The allowed root that `path` (resolved) lies in, or None."""
    real = Path(os.path.realpath(path))
    return next((r for r in roots if real == r or r in real.parents), None)


def _inside(path: Path, roots: list[Path]) -> bool:
    return _root_of(path, roots) is not None


class PathChanged(OSError):
    """A path no longer leads where the plan saw it (a symlinked component, another file)."""


def _open_parent(root: Path, path: Path) -> tuple[int, str]:
    """A handle on `path`'s directory reached from `root` one component at a time, never
    through a symlink, and the last component's name. The caller closes the handle."""
    parts = path.relative_to(root).parts
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise PathChanged(f"{path} is not below {root}")
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:  # ELOOP / ENOTDIR: a symlink or a file where a dir was
                raise PathChanged(f"{path}: component {part!r} is no longer a directory "
                                  f"({exc.strerror}); not followed") from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def _size(path: Path) -> int:
    """Bytes under `path`, never following symlinks."""
    st = path.lstat()
    if stat.S_ISREG(st.st_mode):
        return st.st_size
    if not stat.S_ISDIR(st.st_mode):
        return 0
    total = 0
    for dirpath, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            fst = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(fst.st_mode):
                total += fst.st_size
    return total


def _entries(manifest: Any) -> list[dict[str, Any]] | None:
    """Checkpoint entries of a manifest, tolerating a bare list or {"checkpoints": [...]}."""
    items = manifest.get("checkpoints") if isinstance(manifest, dict) else manifest
    if not isinstance(items, list):
        return None
    return [e for e in items if isinstance(e, dict)]


def _entry_name(entry: dict[str, Any]) -> str | None:
    for key in NAME_KEYS:
        value = entry.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _record_removal(plan: Plan, target: Path, root: Path, item: dict[str, Any]) -> None:
    st = target.lstat()
    plan.where[str(target)] = (root, st.st_dev, st.st_ino)
    plan.remove.append(item)
    plan.bytes_to_free += item["bytes"]


def plan_checkpoints(directory: Path, keep: int, roots: list[Path], plan: Plan) -> None:
    for dirpath, dirs, files in os.walk(directory, followlinks=False):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]
        if MANIFEST not in files or os.path.islink(os.path.join(dirpath, MANIFEST)):
            continue
        here = Path(dirpath)
        try:
            manifest = json.loads((here / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            plan.errors.append(f"{here / MANIFEST}: unreadable ({exc}); nothing removed here")
            continue
        entries = _entries(manifest)
        if entries is None:
            plan.errors.append(f"{here / MANIFEST}: no checkpoint list; nothing removed here")
            continue
        # An entry without an integer step cannot be ordered: keep it (never guess what to delete).
        by_step = sorted((e for e in entries if type(e.get("step")) is int),
                         key=lambda e: e["step"], reverse=True)
        kept_ids = {id(e) for e in by_step[:keep]}
        healthy = [e for e in by_step if e.get("healthy") is True]
        if healthy:
            kept_ids.add(id(healthy[0]))
        survivors = [e for e in entries if type(e.get("step")) is not int]
        for entry in survivors:
            plan.keep.append({"path": str(here / (_entry_name(entry) or "?")),
                              "step": entry.get("step"), "reason": "step is not an integer"})
        dropped = []
        for entry in by_step:
            name = _entry_name(entry)
            if id(entry) in kept_ids or name is None:
                reason = "newest healthy" if healthy and entry is healthy[0] else "newest N"
                plan.keep.append({"path": str(here / (name or "?")), "step": entry.get("step"),
                                  "reason": reason if name else "entry names no file"})
                survivors.append(entry)
                continue
            target = here / name
            root = _root_of(target, roots)
            if ("/" in name or name in (".", "..") or not target.exists()
                    or target.is_symlink() or root is None):
                plan.keep.append({"path": str(target), "step": entry.get("step"),
                                  "reason": "missing, symlink or outside the checkpoint dir"})
                survivors.append(entry)
                continue
            dropped.append(entry)
        # A slot named by a kept entry stays on disk, whichever other entries name it too.
        kept_names = {_entry_name(e) for e in survivors}
        removed_names: set[str] = set()
        for entry in dropped:
            name = _entry_name(entry)
            assert name is not None
            target = here / name
            if name in kept_names:
                plan.keep.append({"path": str(target), "step": entry.get("step"),
                                  "reason": "slot also named by a kept entry"})
            elif name not in removed_names:
                removed_names.add(name)
                _record_removal(plan, target, _root_of(target, roots) or Path("/"), {
                    "path": str(target), "bytes": _size(target), "step": entry.get("step"),
                    "reason": f"checkpoint older than the newest {keep}"})
        if dropped:
            manifest_path = here / MANIFEST
            plan.manifests[str(manifest_path)] = [e.get("step") for e in survivors]
            plan.dropped[str(manifest_path)] = (
                _root_of(manifest_path, roots) or Path("/"),
                [(_entry_name(e) or "", e.get("step")) for e in dropped])


def plan_old_files(directory: Path, max_age_days: float, kind: str, roots: list[Path],
                   plan: Plan) -> None:
    cutoff = time.time() - max_age_days * 86400
    for dirpath, dirs, files in os.walk(directory, followlinks=False):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]
        for name in files:
            path = Path(dirpath) / name
            st = path.lstat()
            root = _root_of(path, roots)
            if not stat.S_ISREG(st.st_mode) or st.st_mtime >= cutoff or root is None:
                continue
            _record_removal(plan, path, root, {
                "path": str(path), "bytes": st.st_size,
                "reason": f"{kind} file older than {max_age_days:g} days"})


def _read_manifest(name: str, dir_fd: int) -> Any:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as handle:
        return json.loads(handle.read())


def _rewrite_manifest(path: Path, root: Path, drop: list[tuple[str, Any]]) -> set[str]:
    """Re-read the manifest now and drop only the planned (name, step) entries, so a
    checkpoint the training job added meanwhile stays named; returns the names the rewritten
    manifest still names (their slots must not be deleted)."""
    dir_fd, name = _open_parent(root, path)
    try:
        current = _read_manifest(name, dir_fd)
        entries = _entries(current) or []
        doomed = Counter(drop)  # as many entries as were planned: a duplicate may be kept
        keep = []
        for entry in entries:
            step = entry.get("step")
            pair = (_entry_name(entry) or "", step)
            if type(step) is int and doomed[pair] > 0:
                doomed[pair] -= 1
            else:
                keep.append(entry)
        doc = {**current, "checkpoints": keep} if isinstance(current, dict) else keep
        atomic_write_json(Path(name), doc, dir_fd=dir_fd, indent=2)
        return {n for n in map(_entry_name, keep) if n is not None}
    finally:
        os.close(dir_fd)


def remove_verified(path: Path, root: Path, device: int, inode: int) -> None:
    """Delete `path` (a file, or a directory tree) through handles from `root` down, only if
    it is still the entry (device, inode) the plan saw; PathChanged otherwise."""
    dir_fd, name = _open_parent(root, path)
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (st.st_dev, st.st_ino) != (device, inode) or stat.S_ISLNK(st.st_mode):
            raise PathChanged(f"{path} is no longer the entry the plan saw; not removed")
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)  # fd-based: never follows a symlink inside
        else:
            os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def apply(plan: Plan) -> None:
    """Manifests first, then the files: like the checkpoint manager, a file is deleted only
    after no manifest names it, and never while a kept entry names it."""
    still_named: set[str] = set()
    for manifest_path, (root, drop) in plan.dropped.items():
        path = Path(manifest_path)
        try:
            names = _rewrite_manifest(path, root, drop)
        except (OSError, ValueError) as exc:
            plan.errors.append(f"{path}: not rewritten ({exc}); its checkpoints are kept")
            still_named.update(str(path.parent / n) for n, _ in drop)
            continue
        still_named.update(str(path.parent / n) for n in names)
    for item in plan.remove:
        path = Path(item["path"])
        if item["path"] in still_named:  # e.g. the job saved into this slot meanwhile
            plan.keep.append({"path": item["path"], "step": item.get("step"),
                              "reason": "named by the manifest when applied"})
            continue
        try:
            remove_verified(path, *plan.where[item["path"]])
            plan.bytes_freed += item["bytes"]
        except OSError as exc:
            plan.errors.append(f"{path}: {exc.strerror or exc}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="disk_cleanup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--allowed-root", action="append", required=True, type=Path)
    parser.add_argument("--checkpoints", action="append", default=[], type=Path)
    parser.add_argument("--logs", action="append", default=[], type=Path)
    parser.add_argument("--cache", action="append", default=[], type=Path)
    parser.add_argument("--keep", type=int, default=3, help="newest checkpoints to keep (>=1)")
    parser.add_argument("--max-age-days", type=float, default=7.0)
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = parser.parse_args(argv)
    if args.keep < 1 or args.max_age_days < 0:
        print("disk_cleanup: --keep must be >= 1 and --max-age-days >= 0", file=sys.stderr)
        return 2
    roots = []
    for root in args.allowed_root:
        if not root.is_absolute() or not root.is_dir():
            print(f"disk_cleanup: allowed root {root} must be an existing absolute directory",
                  file=sys.stderr)
            return 2
        roots.append(Path(os.path.realpath(root)))
    plan = Plan(dry_run=args.dry_run)
    for kind, dirs in (("checkpoints", args.checkpoints), ("log", args.logs),
                       ("cache", args.cache)):
        for directory in dirs:
            if not directory.is_absolute() or not _inside(directory, roots):
                print(f"disk_cleanup: {directory} is not under an allowed root", file=sys.stderr)
                return 2
            if not directory.is_dir():
                plan.errors.append(f"{directory}: not a directory, skipped")
                continue
            # Plan from the resolved directory: every planned path is then spelled below its
            # allowed root, the path apply() walks down component by component.
            real = Path(os.path.realpath(directory))
            if kind == "checkpoints":
                plan_checkpoints(real, args.keep, roots, plan)
            else:
                plan_old_files(real, args.max_age_days, kind, roots, plan)
    planning_errors = len(plan.errors)
    if not args.dry_run:
        apply(plan)
    report = plan.report()
    if args.json:
        print(json.dumps(report))
    else:
        verb = "would free" if args.dry_run else "freed"
        for item in plan.remove:
            print(f"{'PLAN' if args.dry_run else 'REMOVED'} {item['path']} "
                  f"({item['bytes']} bytes): {item['reason']}")
        amount = plan.bytes_to_free if args.dry_run else plan.bytes_freed
        print(f"{verb} {amount} bytes")
    return 1 if len(plan.errors) > planning_errors else 0  # a planned removal failed


if __name__ == "__main__":
    sys.exit(main())
