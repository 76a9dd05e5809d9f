"""Settings for `gpu-exporter`: defaults, an optional YAML file, then command-line flags.

The YAML file is validated by a JSON schema (unknown keys and wrong types are rejected with
the offending key named), so a typo never silently falls back to a default.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from trainwatch.exporters import add_version_argument
from trainwatch.exporters.contract.catalog import PORTS
from trainwatch.exporters.node import fast_alerts

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "bind": {"type": "string", "minLength": 1},
        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
        "interval": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
        "deadline": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
        "simulate": {"type": "integer", "minimum": 0, "maximum": 64},
        "process_attribution": {"type": "boolean"},
        "xid_events": {"type": "boolean"},
        "nvlink": {"type": "boolean"},
        "gpm": {"type": "boolean"},
        "log_level": {"enum": ["DEBUG", "INFO", "WARNING", "ERROR"]},
        # fast alerts (trainwatch.exporters.node.fast_alerts): every XID straight to these
        # Alertmanagers, naming this node as the inventory does
        "alertmanager_urls": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "node": {"type": "string", "pattern": f"^{fast_alerts.NODE_NAME.pattern}$"},
        "alertmanager_username": {"type": "string",
                                  "pattern": f"^{fast_alerts.USERNAME.pattern}$"},
        "alertmanager_password_file": {"type": "string", "minLength": 1},
    },
}


class ConfigError(ValueError):
    """A bad flag or config file; the CLI prints it and exits 2."""


class ScenarioError(ValueError):
    """The fake NVML's scenario (`--simulate`, $TRAINWATCH_FAKE_NVML) is malformed; the message
    names the offending key. Defined here, not beside the fake, so that the exporter catches
    it without importing the fake (exporters/node/gpu/nvml_source.py)."""


@dataclass(frozen=True)
class Settings:
    bind: str = "0.0.0.0"  # noqa: S104 - an exporter serves the network by design
    port: int = PORTS["gpu_exporter"]
    interval: float = 5.0
    deadline: float | None = None  # None: one interval
    simulate: int = 0
    process_attribution: bool = True
    xid_events: bool = True
    nvlink: bool = True
    gpm: bool = True  # profiling metrics through NVML GPM where the GPU supports it
    log_level: str = "INFO"
    # Fast alerts: each XID posted to these Alertmanagers at once, labelled with `node` (the
    # inventory host name, as the rules derive it from `instance`); both needed, else off.
    alertmanager_urls: tuple[str, ...] = ()
    node: str | None = None
    # basic auth for an Alertmanager outside loopback (its password read from the file)
    alertmanager_username: str | None = None
    alertmanager_password_file: Path | None = None
    alertmanager_credential: fast_alerts.Credential | None = None  # read by resolve()

    @property
    def cycle_deadline(self) -> float:
        return self.deadline if self.deadline is not None else self.interval


def load_config_file(path: Path) -> dict[str, Any]:
    import jsonschema  # lazy: most deployments pass flags only, and RSS matters here
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config {path} is not UTF-8 text") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from exc
    data = {} if data is None else data
    try:
        jsonschema.validate(data, CONFIG_SCHEMA)
    except jsonschema.ValidationError as exc:
        where = ".".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise ConfigError(f"config {path}: {where}: {exc.message}") from exc
    return data


def _positive(kind: type, upper: float) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not 0 < value <= upper:
            raise argparse.ArgumentTypeError(f"must be in (0, {upper}]: {text}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-exporter",
        description="Prometheus exporter for NVIDIA GPUs (NVML), served from a background "
                    "snapshot so scrapes never wait on the driver.")
    add_version_argument(parser)
    parser.add_argument("--bind", help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=_positive(int, 65535),
                        help=f"listen port (default {PORTS['gpu_exporter']})")
    parser.add_argument("--interval", type=_positive(float, 3600),
                        help="seconds between collection cycles (default 5)")
    parser.add_argument("--deadline", type=_positive(float, 3600),
                        help="seconds a cycle may take before data is reported stale "
                             "(default: one interval)")
    parser.add_argument("--simulate", type=_positive(int, 64), metavar="N",
                        help="serve N simulated GPUs from the fake NVML (demo, laptops)")
    parser.add_argument("--no-gpm", dest="gpm", action="store_const", const=False,
                        help="do not read the GPM profiling metrics (SM/tensor/DRAM activity)")
    fast_alerts.add_arguments(parser, what="every XID")
    parser.add_argument("--config", type=Path, metavar="FILE", help="optional YAML settings")
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def resolve(args: argparse.Namespace) -> Settings:
    """Defaults < config file < flags."""
    settings = Settings()
    if args.config is not None:
        settings = replace(settings, **load_config_file(args.config))
    overrides = {f.name: getattr(args, f.name) for f in fields(Settings)
                 if getattr(args, f.name, None) is not None}
    settings = replace(settings, **overrides)
    if settings.node is not None and not fast_alerts.NODE_NAME.fullmatch(settings.node):
        raise ConfigError(f"node {settings.node!r}: a plain host name only")
    password_file = settings.alertmanager_password_file
    try:
        urls = fast_alerts.check_settings(settings.alertmanager_urls, settings.node)
        credential = fast_alerts.read_credential(
            settings.alertmanager_username,
            Path(password_file) if password_file is not None else None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return replace(settings, alertmanager_urls=urls, alertmanager_credential=credential)
