"""The service's YAML config: validated against schemas/config.schema.json, then typed."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainwatch.exporters.contract.catalog import PORTS
from trainwatch.exporters.contract.tokens import MIN_TOKEN_LENGTH, SecretFileError, read_secret_file
from trainwatch.remediation.approvers import ApproverError, Approvers, load_approvers
from trainwatch.remediation.durations import seconds
from trainwatch.remediation.schemas import first_error

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_PLAYBOOKS_DIR = PACKAGE_DIR / "playbooks"
# The host actions' playbooks inside an installed trainwatch.stack collection.
COLLECTION_PLAYBOOKS = Path("ansible_collections", "trainwatch", "stack", "playbooks",
                            "remediation")


def collections_paths() -> list[Path]:
    """Where Ansible looks for installed collections, in its order: its configured paths
    (ANSIBLE_COLLECTIONS_PATH, ansible.cfg's collections_path, else ~/.ansible/collections and
    /usr/share/ansible/collections), then the Python path (collections installed with pip)."""
    try:
        from ansible import constants

        configured = [Path(p) for p in constants.COLLECTIONS_PATHS]
    except ImportError:  # no ansible-core here: its defaults, and the variable it reads first
        env = os.environ.get("ANSIBLE_COLLECTIONS_PATH", "")
        configured = ([Path(p) for p in env.split(os.pathsep) if p] if env else
                      [Path.home() / ".ansible" / "collections",
                       Path("/usr/share/ansible/collections")])
    return [p.expanduser() for p in configured] + [Path(p) for p in sys.path if p]


def default_ansible_playbooks_dir() -> Path:
    """`ansible_playbooks_dir` when the config names none: the playbooks of the first
    installed trainwatch.stack collection Ansible would use (the deployment configures the
    folder it copies them to instead). When none is installed, where Ansible would look first,
    so that the error names a real place."""
    candidates = [path / COLLECTION_PLAYBOOKS for path in collections_paths()]
    return next((c for c in candidates if c.is_dir()), candidates[0])


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the bad key."""


@dataclass(frozen=True)
class PgSettings:
    """Where a PostgreSQL store lives (config `store:`); the password is read from its file."""

    host: str
    dbname: str
    user: str
    password: str = field(repr=False)
    port: int = PORTS["postgresql"]
    sslmode: str = "prefer"
    connect_timeout: int = 10

    @property
    def location(self) -> str:
        """For messages and logs: never the password."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.dbname}"


@dataclass(frozen=True)
class SchedulerSettings:
    """Config `scheduler:` (issue 23): where the scheduler's commands are, and the rails of
    the quarantine action (trainwatch.remediation.actions.quarantine)."""

    kind: str = "slurm"
    bin_dir: Path | None = None
    slurm_conf: Path | None = None
    command_timeout_seconds: float = 30.0
    # An intent whose scheduler does not answer keeps trying (back-off doubling from the
    # service's retry_backoff up to retry_backoff_max) until this long after its first
    # failure, then fails and pages: a slurmctld restart or failover loses nothing.
    retry_until_seconds: float = 600.0
    retry_backoff_max_seconds: float = 30.0
    max_quarantined: int = 2
    quarantine_window_seconds: float = 3600.0
    min_healthy_fraction: float = 0.75
    # the lemon_faults-th quarantine of one node inside quarantine_window keeps it out (pages)
    lemon_faults: int = 3
    # a restart-only fault restarts one job at most max_restarts times per restart_window
    max_restarts: int = 3
    restart_window_seconds: float = 3600.0
    # how long a quarantine held for approval waits for a decision (past its alert's resolve)
    hold_expiry_seconds: float = 3600.0
    # How long after a hard event the rule's own alert of it can begin (scrape + evaluation +
    # the rule's `for:`, with room): a rule alert that begins this soon after the event of a
    # fast alert that drained its node is that event's, and drains nothing again. The
    # production profile's XID rule: 15 s + 15 s + 1m.
    rule_alert_lag_seconds: float = 180.0
    fault_classes_file: Path | None = None


@dataclass(frozen=True)
class Config:
    """Everything the app, the worker and the actions need; secrets are read once, here."""

    webhook_token: str
    training_exporter_token: str
    store_path: Path  # SQLite file; with PostgreSQL, only the default marker's directory
    prometheus_url: str
    alertmanager_url: str
    bind: str = "127.0.0.1"
    port: int = PORTS["remediation"]
    playbooks_dir: Path = DEFAULT_PLAYBOOKS_DIR
    ansible_playbooks_dir: Path = field(default_factory=default_ansible_playbooks_dir)
    ansible_inventory: Path | None = None
    dry_run: bool = False
    pager_url: str | None = None
    max_body_bytes: int = 1024 * 1024
    worker_threads: int = 2
    http_threads: int = 8
    lease_seconds: float = 60.0
    max_attempts: int = 3
    retry_backoff_seconds: float = 5.0
    poll_interval_seconds: float = 0.2
    action_timeout_seconds: float = 300.0
    approvers_file: Path | None = None
    approvers: Approvers = field(default_factory=Approvers)
    store_max_bytes: int | None = None
    store_marker_path: Path | None = None  # default: "<store_path>.marker"
    audit_retention_seconds: float = 90 * 86400.0
    request_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 30.0
    max_connections: int = 1000
    breaker_max_actions: int = 20
    breaker_window_seconds: float = 600.0
    # basic auth for an Alertmanager API that is open to the network (docs/deploy.md)
    alertmanager_auth: tuple[str, str] | None = field(default=None, repr=False)
    # per-priority limits (low / normal / high); a priority not named uses breaker_max_actions
    breaker_max_by_priority: tuple[tuple[str, int], ...] = ()
    # None: SQLite at store_path (the single-host default); set: PostgreSQL
    # (trainwatch.remediation.pgstore)
    postgresql: PgSettings | None = None
    # None: no scheduler actions (a quarantine step is refused)
    scheduler: SchedulerSettings | None = None
    # TLS (docs/deploy.md "TLS"): with a certificate and key the service speaks only HTTPS;
    # with a CA file it calls the training exporters' control APIs over HTTPS, verified
    # against that CA (and nothing else: plain HTTP to them is not tried).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None

    @property
    def control_api_scheme(self) -> str:
        """How the training exporters' control APIs are reached."""
        return "https" if self.tls_ca_file is not None else "http"

    @property
    def store_location(self) -> str:
        """The store named in messages: a file or a database (no secrets)."""
        return self.postgresql.location if self.postgresql else str(self.store_path)

    @property
    def marker_path(self) -> Path:
        """The file outside the store that says a store existed here (marker.py)."""
        return self.store_marker_path or self.store_path.with_name(self.store_path.name
                                                                   + ".marker")

    def breaker_limit(self, priority: str) -> int:
        """The circuit breaker limit of one playbook priority."""
        return dict(self.breaker_max_by_priority).get(priority, self.breaker_max_actions)


def _read_secret(path: Path, key: str, source: Path, *, min_length: int = 1) -> str:
    try:
        return read_secret_file(path, min_length=min_length)
    except SecretFileError as exc:
        raise ConfigError(f"{source}: {key}: {exc}") from None


def _resolve(base: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def _scheduler(raw: dict[str, object], base: Path) -> SchedulerSettings:
    out: dict[str, object] = {"kind": raw["kind"]}
    for key in ("bin_dir", "slurm_conf", "fault_classes_file"):
        if key in raw:
            out[key] = _resolve(base, str(raw[key]))
    for key, name in (("command_timeout", "command_timeout_seconds"),
                      ("quarantine_window", "quarantine_window_seconds"),
                      ("retry_until", "retry_until_seconds"),
                      ("retry_backoff_max", "retry_backoff_max_seconds"),
                      ("restart_window", "restart_window_seconds"),
                      ("hold_expiry", "hold_expiry_seconds"),
                      ("rule_alert_lag", "rule_alert_lag_seconds")):
        if key in raw:
            out[name] = seconds(raw[key])  # type: ignore[arg-type]
    for key in ("max_quarantined", "min_healthy_fraction", "lemon_faults", "max_restarts"):
        if key in raw:
            out[key] = raw[key]
    return SchedulerSettings(**out)  # type: ignore[arg-type]


def load_config(path: Path) -> Config:
    """Read, validate and type a config file; any problem raises ConfigError naming file+key."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return config_from_dict(raw, path)


def config_from_dict(raw: object, source: Path) -> Config:
    """Validate a parsed config document (see load_config); relative paths are file-relative."""
    error = first_error("config", raw)
    if error:
        raise ConfigError(f"{source}: {error}")
    assert isinstance(raw, dict)
    base = source.resolve().parent
    breaker = raw.get("circuit_breaker", {})
    optional: dict[str, object] = {}
    for key in ("bind", "port", "dry_run", "pager_url", "max_body_bytes", "worker_threads",
                "http_threads", "max_attempts", "store_max_bytes", "max_connections"):
        if key in raw:
            optional[key] = raw[key]
    for key in ("lease_seconds", "retry_backoff_seconds", "poll_interval_seconds",
                "action_timeout_seconds", "request_timeout_seconds", "idle_timeout_seconds"):
        if key in raw:
            optional[key] = float(raw[key])
    for key in ("playbooks_dir", "ansible_playbooks_dir", "ansible_inventory", "approvers_file",
                "store_marker_path", "tls_cert_file", "tls_key_file", "tls_ca_file"):
        if key in raw:
            optional[key] = _resolve(base, raw[key])
    if ("tls_cert_file" in optional) != ("tls_key_file" in optional):
        raise ConfigError(f"{source}: tls_cert_file and tls_key_file go together")
    for key in ("tls_cert_file", "tls_key_file", "tls_ca_file"):
        if key in optional and not Path(str(optional[key])).is_file():
            raise ConfigError(f"{source}: {key}: {optional[key]} is not a file")
    for key in ("playbooks_dir", "ansible_playbooks_dir"):
        if key in optional and not Path(str(optional[key])).is_dir():
            raise ConfigError(f"{source}: {key}: {optional[key]} is not a directory")
    if "audit_retention" in raw:
        optional["audit_retention_seconds"] = seconds(raw["audit_retention"])
        if optional["audit_retention_seconds"] < 86400:  # type: ignore[operator]
            # grants older than this go too: keep them past every cooldown/rate-limit window
            raise ConfigError(f"{source}: audit_retention: must be at least 1d")
    if "alertmanager_password_file" in raw:
        optional["alertmanager_auth"] = (
            raw.get("alertmanager_username", "trainwatch"),
            _read_secret(_resolve(base, raw["alertmanager_password_file"]),
                         "alertmanager_password_file", source))
    store = raw.get("store", {"backend": "sqlite"})
    if store["backend"] == "postgresql":
        missing = [k for k in ("host", "dbname", "user", "password_file") if k not in store]
        if missing:
            raise ConfigError(f"{source}: store: backend postgresql needs {', '.join(missing)}")
        optional["postgresql"] = PgSettings(
            host=store["host"], dbname=store["dbname"], user=store["user"],
            password=_read_secret(_resolve(base, store["password_file"]),
                                  "store.password_file", source),
            **{k: store[k] for k in ("port", "sslmode", "connect_timeout") if k in store})
        # the marker (trainwatch.remediation.marker) stays on this host, next to the config by
        # default
        store_path = _resolve(base, raw.get("store_path", "remediation-store"))
    elif "store_path" in raw:
        store_path = _resolve(base, raw["store_path"])
    else:
        raise ConfigError(f"{source}: store_path is required with the sqlite store")
    if "scheduler" in raw:
        optional["scheduler"] = _scheduler(raw["scheduler"], base)
    if breaker:
        optional["breaker_max_actions"] = breaker["max_actions"]
        optional["breaker_window_seconds"] = seconds(breaker["window"])
        optional["breaker_max_by_priority"] = tuple(sorted(
            breaker.get("max_actions_by_priority", {}).items()))
    webhook_token = _read_secret(_resolve(base, raw["webhook_token_file"]),
                                 "webhook_token_file", source, min_length=MIN_TOKEN_LENGTH)
    if "approvers_file" in optional:
        try:
            optional["approvers"] = load_approvers(Path(str(optional["approvers_file"])),
                                                   webhook_token=webhook_token)
        except ApproverError as exc:
            raise ConfigError(f"{source}: approvers_file: {exc}") from exc
    return Config(
        webhook_token=webhook_token,
        training_exporter_token=_read_secret(_resolve(base, raw["training_exporter_token_file"]),
                                             "training_exporter_token_file", source,
                                             min_length=MIN_TOKEN_LENGTH),
        store_path=store_path,
        prometheus_url=raw["prometheus_url"].rstrip("/"),
        alertmanager_url=raw["alertmanager_url"].rstrip("/"),
        **optional,  # type: ignore[arg-type]
    )
