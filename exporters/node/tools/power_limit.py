"""Set, reduce or restore one GPU's power limit: the remediation playbook's tool.

    python -m trainwatch.exporters.node.tools.power_limit --gpu 0 \\
        (--watts W | --reduce-by-percent P | --restore)
                                        [--command-id ID] [--dry-run] [--json]
                                        [--state-file PATH]

The target is clamped to the card's [min, max] as NVML reports them. Before the first change
the current limit is saved (per GPU UUID) in a small JSON state file, so `--restore` puts back
what the operator had, not merely the factory default (used when nothing was saved).

Convergent, because the documented recovery after a crash is to run the same step again:
the target is absolute, computed from the saved original (`--reduce-by-percent 15` means 15 %
below the operator's limit, never 15 % below whatever is in force now, which cut again on
every re-run), and a `--command-id` that already completed is a no-op. The state entry is
written before the limit changes and marked complete after, so a run killed in between is
finished by the next run of the same command, from the same original.

With TRAINWATCH_FAKE_NVML set, the fake NVML is used and the change is written back to that
scenario file, so a running simulated exporter reports the new limit.
Exit status: 0 done, 2 bad arguments, 1 NVML or state-file failure (one-line reason on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pynvml

from trainwatch.exporters.contract.atomic_file import atomic_write_json
from trainwatch.exporters.node.gpu.config import ScenarioError
from trainwatch.exporters.node.gpu.nvml_source import ENV_FAKE_NVML, load_nvml
from trainwatch.exporters.node.gpu.reader import error_name, text

ENV_STATE_FILE = "TRAINWATCH_POWER_LIMIT_STATE"
DEFAULT_STATE_FILE = Path("/var/lib/trainwatch/power_limit.json")
MAX_WATTS = 5000.0
# A GPU index exactly as NVML and the exporter spell it: no sign, no leading zero, no space
# (int() would take " 07\n" and "0_7" as 7, an alias the remediation service keys apart).
GPU_INDEX = re.compile(r"0|[1-9][0-9]{0,2}")
COMMAND_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
DONE_KEPT = 64  # completed command ids remembered per GPU
STATE_VERSION = 2


class PowerLimitError(Exception):
    """A failure the operator must see; the message is the whole story."""


def _bounded(kind: type, low: float, high: float, *, low_inclusive: bool = True) -> Any:
    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        # NaN compares false with everything: test finiteness, not only the bounds
        if (not math.isfinite(number) or number < low or (number == low and not low_inclusive)
                or number > high):
            raise argparse.ArgumentTypeError(f"{value} is outside the allowed range")
        return number
    return parse


def _matching(pattern: re.Pattern[str], what: str, convert: type = str) -> Any:
    def parse(value: str) -> Any:
        if not pattern.fullmatch(value):
            raise argparse.ArgumentTypeError(f"{what} must match {pattern.pattern}: {value!r}")
        return convert(value)
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainwatch.exporters.node.tools.power_limit",
                                     description="Set, reduce or restore a GPU power limit.")
    parser.add_argument("--gpu", required=True, type=_matching(GPU_INDEX, "--gpu", int),
                        help="NVML GPU index, 0-999, as the exporter labels it (no sign, no "
                             "leading zero)")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--watts", type=_bounded(float, 0, MAX_WATTS, low_inclusive=False),
                      help="new limit in watts (clamped to the card's range)")
    mode.add_argument("--reduce-by-percent", type=_bounded(float, 0, 90, low_inclusive=False),
                      metavar="P", help="set the limit P percent below the operator's (saved) "
                                        "limit, however often it runs (0 < P <= 90)")
    mode.add_argument("--restore", action="store_true",
                      help="restore the limit saved before the first change (else the default)")
    parser.add_argument("--command-id", type=_matching(COMMAND_ID, "--command-id"),
                        help="the remediation step's id: once it completed, running it again "
                             "changes nothing")
    parser.add_argument("--dry-run", action="store_true", help="compute and print, change nothing")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--state-file", type=Path, help="where saved limits live")
    return parser


def state_file(args: argparse.Namespace) -> Path:
    if args.state_file is not None:
        return args.state_file
    if os.environ.get(ENV_STATE_FILE):
        return Path(os.environ[ENV_STATE_FILE])
    fake = os.environ.get(ENV_FAKE_NVML)
    if fake:  # keep a simulated machine's state next to its scenario
        return Path(fake).with_name(Path(fake).stem + ".power_limit_state.json")
    return DEFAULT_STATE_FILE


def _entry(value: Any) -> dict[str, Any] | None:
    """One GPU's saved state, or None if malformed. A bare integer is the state file of
    earlier versions: the original limit, with our change in force."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"original_mw": value, "ours": True, "command_id": None, "complete": True,
                "done": []}
    if not isinstance(value, dict):
        return None
    ok = (isinstance(value.get("original_mw"), int) and isinstance(value.get("ours"), bool)
          and isinstance(value.get("complete"), bool)
          and (value.get("command_id") is None or isinstance(value.get("command_id"), str))
          and isinstance(value.get("done"), list)
          and all(isinstance(d, str) for d in value["done"]))
    return value if ok else None


def _read_state(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as exc:
        raise PowerLimitError(f"cannot read state file {path}: {exc}") from exc
    if isinstance(data, dict) and "version" in data:  # else the bare {uuid: mW} of before
        if data["version"] != STATE_VERSION:
            raise PowerLimitError(f"state file {path} has version {data['version']!r}; this "
                                  f"tool reads version {STATE_VERSION}")
        data = data.get("gpus")
    entries = {k: _entry(v) for k, v in data.items()} if isinstance(data, dict) else None
    if entries is None or any(v is None for v in entries.values()):
        raise PowerLimitError(f"state file {path} is malformed; fix or remove it")
    return entries  # type: ignore[return-value]


def _write_state(path: Path, state: dict[str, dict[str, Any]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"version": STATE_VERSION, "gpus": state}, sort_keys=True)
    except OSError as exc:
        raise PowerLimitError(f"cannot write state file {path}: {exc.strerror}") from exc


def run(args: argparse.Namespace, nvml: Any) -> dict[str, Any]:
    """Apply the request through `nvml`; returns what was done (all limits in watts)."""
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise PowerLimitError(f"NVML init failed: {error_name(exc)}") from exc
    try:
        return _apply(args, nvml)
    except pynvml.NVMLError as exc:
        raise PowerLimitError(f"NVML call failed on GPU {args.gpu}: {error_name(exc)}") from exc
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            nvml.nvmlShutdown()


def _plan(args: argparse.Namespace, entry: dict[str, Any] | None, before: int,
          default: int) -> tuple[int | None, int]:
    """(the operator's original limit to keep saved, or None to save nothing; the requested
    limit). Absolute: never derived from a limit of ours that is in force."""
    ours_in_force = entry is not None and (entry["ours"] or not entry["complete"])
    if args.restore:
        if entry is None:
            return None, default  # nothing saved (ever, or the state file was removed)
        # a completed restore already put the original back: leave the operator's limit alone
        return entry["original_mw"], entry["original_mw"] if ours_in_force else before
    original = entry["original_mw"] if ours_in_force and entry is not None else before
    if args.watts is not None:
        return original, round(args.watts * 1000)
    return original, round(original * (1 - args.reduce_by_percent / 100))


def _apply(args: argparse.Namespace, nvml: Any) -> dict[str, Any]:
    count = nvml.nvmlDeviceGetCount()
    if args.gpu >= count:
        raise PowerLimitError(f"GPU {args.gpu} does not exist (this host has {count})")
    handle = nvml.nvmlDeviceGetHandleByIndex(args.gpu)
    uuid = text(nvml.nvmlDeviceGetUUID(handle))
    low, high = nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
    default = nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)
    before = nvml.nvmlDeviceGetPowerManagementLimit(handle)
    path = state_file(args)
    state = _read_state(path)
    entry = state.get(uuid)
    command_id = args.command_id
    already = bool(command_id and entry is not None and command_id in entry["done"])
    if already:  # this step completed before: a re-run (crash recovery, retry) is a no-op
        original, requested = (entry or {}).get("original_mw"), before
    else:
        original, requested = _plan(args, entry, before, default)
    target = requested if already else min(max(requested, low), high)
    if not args.dry_run and not already:
        done = list(entry["done"]) if entry is not None else []
        if original is not None:  # saved before the limit changes, so a crash keeps it
            state[uuid] = {"original_mw": original, "ours": not args.restore,
                           "command_id": command_id, "complete": False, "done": done}
            _write_state(path, state)
        if target != before:
            nvml.nvmlDeviceSetPowerManagementLimit(handle, target)
        if original is not None:
            state[uuid].update(complete=True,
                               done=[*done, command_id][-DONE_KEPT:] if command_id else done)
            _write_state(path, state)
    after = target if args.dry_run else nvml.nvmlDeviceGetPowerManagementLimit(handle)
    return {
        "gpu": args.gpu, "uuid": uuid, "action": "restore" if args.restore else "set",
        "command_id": command_id, "already_applied": already,
        "dry_run": args.dry_run, "before_watts": before / 1000,
        "requested_watts": requested / 1000, "after_watts": after / 1000,
        "clamped": target != requested, "min_watts": low / 1000, "max_watts": high / 1000,
        "default_watts": default / 1000,
        "original_watts": original / 1000 if original is not None else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        nvml, _ = load_nvml()
        result = run(args, nvml)
    except (PowerLimitError, ScenarioError, OSError) as exc:
        print(f"power_limit: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        verb = "would set" if args.dry_run else "set"
        print(f"GPU {result['gpu']} ({result['uuid']}): {verb} power limit "
              f"{result['before_watts']:g} W -> {result['after_watts']:g} W"
              f"{' (clamped)' if result['clamped'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
