"""Set, reduce or restore one GPU's power limit: the remediation playbook's tool.

    python -m exporters.gpu.power_limit --gpu 0 (--watts W | --reduce-by-percent P | --restore)
                                        [--dry-run] [--json] [--state-file PATH]

The target is clamped to the card's [min, max] as NVML reports them. Before the first change
the current limit is saved (per GPU UUID) in a small JSON state file, so `--restore` puts back
what the operator had, not merely the factory default (used when nothing was saved).
With TRAINWATCH_FAKE_NVML set, the fake NVML is used and the change is written back to that
scenario file, so a running simulated exporter reports the new limit.
Exit status: 0 done, 2 bad arguments, 1 NVML or state-file failure (one-line reason on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pynvml

from exporters.atomic_file import atomic_write_json
from exporters.gpu.nvml_source import ENV_FAKE_NVML, ScenarioError, load_nvml
from exporters.gpu.reader import error_name, text

ENV_STATE_FILE = "TRAINWATCH_POWER_LIMIT_STATE"
DEFAULT_STATE_FILE = Path("/var/lib/trainwatch/power_limit.json")
MAX_WATTS = 5000.0


class PowerLimitError(Exception):
    """A failure the operator must see; the message is the whole story."""


def _bounded(kind: type, low: float, high: float, *, low_inclusive: bool = True) -> Any:
    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        if number < low or (number == low and not low_inclusive) or number > high:
            raise argparse.ArgumentTypeError(f"{value} is outside the allowed range")
        return number
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m exporters.gpu.power_limit",
                                     description="Set, reduce or restore a GPU power limit.")
    parser.add_argument("--gpu", required=True, type=_bounded(int, 0, 999),
                        help="NVML GPU index")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--watts", type=_bounded(float, 0, MAX_WATTS, low_inclusive=False),
                      help="new limit in watts (clamped to the card's range)")
    mode.add_argument("--reduce-by-percent", type=_bounded(float, 0, 90, low_inclusive=False),
                      metavar="P", help="lower the current limit by P percent (0 < P <= 90)")
    mode.add_argument("--restore", action="store_true",
                      help="restore the limit saved before the first change (else the default)")
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


def _read_state(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as exc:
        raise PowerLimitError(f"cannot read state file {path}: {exc}") from exc
    if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
        raise PowerLimitError(f"state file {path} is malformed; fix or remove it")
    return data


def _write_state(path: Path, state: dict[str, int]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, state, sort_keys=True)
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
    if args.restore:
        requested = state.get(uuid, default)
    elif args.watts is not None:
        requested = round(args.watts * 1000)
    else:
        requested = round(before * (1 - args.reduce_by_percent / 100))
    target = min(max(requested, low), high)
    if not args.dry_run:
        if not args.restore and uuid not in state:
            state[uuid] = before  # remember the operator's limit before our first change
            _write_state(path, state)
        if target != before:
            nvml.nvmlDeviceSetPowerManagementLimit(handle, target)
        if args.restore and uuid in state:
            del state[uuid]
            _write_state(path, state)
    after = target if args.dry_run else nvml.nvmlDeviceGetPowerManagementLimit(handle)
    return {
        "gpu": args.gpu, "uuid": uuid, "action": "restore" if args.restore else "set",
        "dry_run": args.dry_run, "before_watts": before / 1000,
        "requested_watts": requested / 1000, "after_watts": after / 1000,
        "clamped": target != requested, "min_watts": low / 1000, "max_watts": high / 1000,
        "default_watts": default / 1000,
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
