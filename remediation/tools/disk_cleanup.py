"""Plan (and with --apply, carry out) a disk cleanup under allowlisted roots only.

    python -m remediation.tools.disk_cleanup --allowed-root /data \
        --checkpoints /data/ckpt --logs /data/logs --cache /data/cache \
        --keep 3 --max-age-days 7 [--dry-run] [--json]

Rules, in the order they protect data:
* every directory given must resolve (realpath) inside an --allowed-root, else exit 2;
* symlinks are never followed and never removed (os.walk(followlinks=False), lstat);
* checkpoints: a directory with a `manifest.json` (the training checkpoint manager's format:
  entries with `step`, `loss`, `healthy` and a file name) keeps the newest N entries by step and
  the newest healthy one; only files/dirs named by removed entries are deleted, and the
  manifest is rewritten atomically without them. Files the manifest does not name are kept.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from exporters.atomic_file import atomic_write_json

MANIFEST = "manifest.json"
NAME_KEYS = ("dir", "path", "file", "filename", "name")  # "dir": the DCP checkpoints


@dataclass
class Plan:
    dry_run: bool
    remove: list[dict[str, Any]] = field(default_factory=list)
    keep: list[dict[str, Any]] = field(default_factory=list)
    manifests: dict[str, list[Any]] = field(default_factory=dict)  # path -> steps kept
    errors: list[str] = field(default_factory=list)
    bytes_to_free: int = 0
    bytes_freed: int = 0


def _inside(path: Path, roots: list[Path]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real == r or r in real.parents for r in roots)


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
        for entry in by_step:
            name = _entry_name(entry)
            if id(entry) in kept_ids or name is None:
                reason = "newest healthy" if healthy and entry is healthy[0] else "newest N"
                plan.keep.append({"path": str(here / (name or "?")), "step": entry.get("step"),
                                  "reason": reason if name else "entry names no file"})
                survivors.append(entry)
                continue
            target = here / name
            if ("/" in name or name in (".", "..") or not target.exists()
                    or target.is_symlink() or not _inside(target, roots)):
                plan.keep.append({"path": str(target), "step": entry.get("step"),
                                  "reason": "missing, symlink or outside the checkpoint dir"})
                survivors.append(entry)
                continue
            size = _size(target)
            plan.remove.append({"path": str(target), "bytes": size, "step": entry.get("step"),
                                "reason": f"checkpoint older than the newest {keep}"})
            plan.bytes_to_free += size
        if len(survivors) != len(entries):
            plan.manifests[str(here / MANIFEST)] = [e.get("step") for e in survivors]


def plan_old_files(directory: Path, max_age_days: float, kind: str, roots: list[Path],
                   plan: Plan) -> None:
    cutoff = time.time() - max_age_days * 86400
    for dirpath, dirs, files in os.walk(directory, followlinks=False):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]
        for name in files:
            path = Path(dirpath) / name
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode) or st.st_mtime >= cutoff or not _inside(path, roots):
                continue
            plan.remove.append({"path": str(path), "bytes": st.st_size,
                                "reason": f"{kind} file older than {max_age_days:g} days"})
            plan.bytes_to_free += st.st_size


def _write_manifest(path: Path, original: Any, entries: list[dict[str, Any]]) -> None:
    """Atomic rewrite (temp file in the same dir, fsync, rename), like the checkpoint manager."""
    doc = {**original, "checkpoints": entries} if isinstance(original, dict) else entries
    atomic_write_json(path, doc, indent=2)


def apply(plan: Plan) -> None:
    """Manifests first (re-read now, dropping only the planned entries, so a checkpoint the
    training job added meanwhile stays named), then the files: like the checkpoint manager,
    a file is deleted only after no manifest names it."""
    removed = {item["path"] for item in plan.remove}
    for manifest_path in plan.manifests:
        path = Path(manifest_path)
        current = json.loads(path.read_text())
        entries = _entries(current) or []
        keep = [e for e in entries
                if str(path.parent / (_entry_name(e) or "\0")) not in removed]
        _write_manifest(path, current, keep)
    for item in plan.remove:
        path = Path(item["path"])
        try:
            if path.is_symlink():
                continue
            if path.is_dir():
                shutil.rmtree(path)  # rmtree never follows symlinks inside the tree
            else:
                path.unlink()
            plan.bytes_freed += item["bytes"]
        except OSError as exc:
            plan.errors.append(f"{path}: {exc.strerror}")


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
            if kind == "checkpoints":
                plan_checkpoints(directory, args.keep, roots, plan)
            else:
                plan_old_files(directory, args.max_age_days, kind, roots, plan)
    planning_errors = len(plan.errors)
    if not args.dry_run:
        apply(plan)
    report = asdict(plan)
    report["manifests"] = sorted(plan.manifests)
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
