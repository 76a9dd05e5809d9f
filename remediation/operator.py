"""`trainwatch`: the on-call engineer's view of training jobs, alerts and remediation.

    trainwatch status                      the jobs with their health, then recent incidents
    trainwatch jobs                        one row per training job (ranks, step, open alerts)
    trainwatch incidents [--state S] [--limit N]
                                           what remediation received and did
    trainwatch actions [--state S] [--limit N]
                                           the service's intents and audit records (JSON)
    trainwatch approve ID | reject ID      decide an action awaiting approval
    trainwatch silence (--job J | --node N) --for 2h [--comment TEXT]
                                           an Alertmanager silence on one job or node
    trainwatch silences                    the active silences
    trainwatch unsilence SILENCE_ID        expire a silence this CLI made
    trainwatch approvers list | add NAME | revoke NAME
                                           the approvers file (on the remediation host)

Tables by default; `--json` prints the same rows as JSON. No `--url` on every call: each
setting comes from the environment, else your config file, else the file the deployment wrote
for this CLI, else Trainwatch's default ports on this host:

    prometheus_url     TRAINWATCH_PROMETHEUS_URL     http://127.0.0.1:<prometheus port>
    alertmanager_url   TRAINWATCH_ALERTMANAGER_URL   http://127.0.0.1:<alertmanager port>
    remediation_url    TRAINWATCH_REMEDIATION_URL    http://127.0.0.1:<remediation port>
    token_file         TRAINWATCH_TOKEN_FILE         your approver token (the webhook token
                                                     can only read)
    approvers_file     TRAINWATCH_APPROVERS_FILE     for `approvers`
    alertmanager_user  TRAINWATCH_ALERTMANAGER_USER  with alertmanager_password_file
    alertmanager_password_file  TRAINWATCH_ALERTMANAGER_PASSWORD_FILE
                                                     (the deploy's API password; optional)
    ca_file            TRAINWATCH_CA_FILE            the CA that https:// services are
                                                     verified against (the deploy's, with
                                                     trainwatch_tls); else the system's

Your config file (YAML, the keys above) is --config, else $TRAINWATCH_CONFIG, else
~/.config/trainwatch/cli.yml when it exists. The deployment's file (same keys, written by the
remediation role) is etc/trainwatch/cli.yml in the environment this CLI is installed in, else
/etc/trainwatch/cli.yml. Without a token, `status` shows the jobs and says why it cannot show
incidents. Exit status: 0 done, 1 a service answered an error or could not be reached, 2 bad
input or configuration (nothing was changed).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import requests
import yaml

from trainwatch.exporters import add_version_argument
from trainwatch.exporters.contract.catalog import PORTS
from trainwatch.exporters.contract.tokens import SecretFileError, read_secret_file
from trainwatch.remediation import approvers as approver_file
from trainwatch.remediation.labels import LabelError, canonical

PROG = "trainwatch"
ENV_CONFIG = "TRAINWATCH_CONFIG"
DEFAULT_CONFIG = Path("~/.config/trainwatch/cli.yml")
# Where a deployment leaves the addresses of its services for this CLI, nearest first: the
# environment the CLI runs from (a deployed host's venv, or the checkout's .venv the demo
# registers), then the host's. The remediation role writes them (remediation_cli_config_files).
DEPLOYMENT_CONFIGS = (Path(sys.prefix) / "etc" / "trainwatch" / "cli.yml",
                      Path("/etc/trainwatch/cli.yml"))
KEYS = {  # config key -> (environment variable, default)
    "prometheus_url": ("TRAINWATCH_PROMETHEUS_URL", f"http://127.0.0.1:{PORTS['prometheus']}"),
    "alertmanager_url": ("TRAINWATCH_ALERTMANAGER_URL",
                         f"http://127.0.0.1:{PORTS['alertmanager']}"),
    "remediation_url": ("TRAINWATCH_REMEDIATION_URL",
                        f"http://127.0.0.1:{PORTS['remediation']}"),
    "token_file": ("TRAINWATCH_TOKEN_FILE", None),
    "approvers_file": ("TRAINWATCH_APPROVERS_FILE", None),
    "alertmanager_user": ("TRAINWATCH_ALERTMANAGER_USER", None),
    "alertmanager_password_file": ("TRAINWATCH_ALERTMANAGER_PASSWORD_FILE", None),
    "ca_file": ("TRAINWATCH_CA_FILE", None),
}
TIMEOUT = 10.0
MAX_SILENCE_SECONDS = 7 * 86400  # a forgotten silence hides pages; a week at most
MIN_SILENCE_SECONDS = 60  # Alertmanager evaluates silences against alerts, not instants
# What a person types for an id or a duration, spelled one way: ASCII digits, no sign, no
# underscore, no surrounding space or newline (int() and `$` accept all of those, and
# `approve 1_0` would decide intent 10).
_ID = re.compile(r"[1-9][0-9]{0,17}", re.ASCII)
_COUNT = re.compile(r"[1-9][0-9]{0,4}", re.ASCII)
_SILENCE_FOR = re.compile(r"([1-9][0-9]{0,5})([mhd])", re.ASCII)
_SILENCE_UNITS = {"m": 60, "h": 3600, "d": 86400}
_SILENCE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.ASCII)
CREATED_BY_SUFFIX = " (trainwatch)"  # how this CLI signs the silences it makes


class UsageError(Exception):
    """Bad input or configuration: exit 2, nothing changed."""


class ServiceError(Exception):
    """A service could not be reached or answered an error: exit 1."""


@dataclass(frozen=True)
class Settings:
    values: dict[str, str]

    def get(self, key: str) -> str:
        value = self.values.get(key)
        if not value:
            env, _ = KEYS[key]
            raise UsageError(f"{key} is not set: set {env} or `{key}:` in the config file")
        return value

    def url(self, key: str) -> str:
        value = self.get(key).rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise UsageError(f"{key} {value!r} is not an http(s) URL")
        return value

    def verify(self) -> str | bool:
        """What requests verifies https:// against: `ca_file` where set (passed on every
        request, so REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE in the environment cannot replace
        it), else the system's CAs."""
        ca_file = self.values.get("ca_file")
        if not ca_file:
            return True
        if not Path(ca_file).is_file():
            raise UsageError(f"ca_file {ca_file!r} is not a readable file")
        return ca_file

    def token(self) -> str:
        try:
            return read_secret_file(Path(self.get("token_file")))
        except SecretFileError as exc:
            raise UsageError(str(exc)) from exc

    def alertmanager_auth(self) -> tuple[str, str] | None:
        user = self.values.get("alertmanager_user")
        if not user:
            return None
        try:
            return user, read_secret_file(Path(self.get("alertmanager_password_file")))
        except SecretFileError as exc:
            raise UsageError(str(exc)) from exc


def _read_config(path: Path) -> dict[str, Any]:
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read the config: {exc}") from exc
    if not isinstance(values, dict):
        raise UsageError(f"{path}: expected a mapping of {sorted(KEYS)}")
    unknown = set(values) - set(KEYS)
    if unknown:
        raise UsageError(f"{path}: unknown keys {sorted(unknown)} (known: {sorted(KEYS)})")
    return values


def load_settings(config: Path | None, environ: dict[str, str],
                  deployment_configs: Sequence[Path] = DEPLOYMENT_CONFIGS) -> Settings:
    """Environment over your config file over the deployment's over the defaults; unknown
    keys in either file are errors."""
    path = config or (Path(environ[ENV_CONFIG]) if environ.get(ENV_CONFIG) else None)
    default_path = DEFAULT_CONFIG.expanduser()
    if path is None and default_path.is_file():
        path = default_path
    from_file = _read_config(path) if path is not None else {}
    deployed = next((p for p in deployment_configs if p.is_file()), None)
    from_deploy = _read_config(deployed) if deployed is not None else {}
    values: dict[str, str] = {}
    for key, (env, default) in KEYS.items():
        value = environ.get(env) or from_file.get(key) or from_deploy.get(key) or default
        if value is not None:
            values[key] = str(value)
    return Settings(values)


# --- what a person types --------------------------------------------------------------------

def intent_id(text: str) -> int:
    """An intent id exactly as the service prints it (argparse `type`)."""
    if not _ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an intent id (digits 0-9, e.g. 42)")
    return int(text)


def silence_id(text: str) -> str:
    """An Alertmanager silence id (a UUID, lower case), exactly (argparse `type`)."""
    if not _SILENCE_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a silence id (see `trainwatch "
                                         "silences`)")
    return text


def count(text: str) -> int:
    """A positive row count (argparse `type`), spelled like an id."""
    if not _COUNT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (1 to 99999)")
    return int(text)


def silence_seconds(text: str) -> int:
    """`--for`: a whole number of minutes, hours or days, within the bounds a silence may
    last (never a fraction that rounds to nothing, never a unit finer than a minute)."""
    match = _SILENCE_FOR.fullmatch(text)
    if not match:
        raise UsageError(f"--for {text!r}: expected a whole number and m, h or d (e.g. 30m, "
                         "2h, 1d)")
    length = int(match.group(1)) * _SILENCE_UNITS[match.group(2)]
    if not MIN_SILENCE_SECONDS <= length <= MAX_SILENCE_SECONDS:
        raise UsageError(f"--for {text!r}: a silence lasts 1m to "
                         f"{MAX_SILENCE_SECONDS // 86400}d")
    return length


# --- talking to the services ----------------------------------------------------------------

def _call(settings: Settings, method: str, url: str, what: str, **kwargs: Any) -> Any:
    try:
        resp = requests.request(method, url, timeout=TIMEOUT, verify=settings.verify(),
                                **kwargs)
    except requests.RequestException as exc:
        raise ServiceError(f"{what} unreachable at {url.split('/api')[0].split('/v1')[0]}: "
                           f"{type(exc).__name__}") from exc
    try:
        body = resp.json()
    except ValueError:
        body = {"error": resp.text[:300]}
    if not resp.ok:
        message = body.get("error") if isinstance(body, dict) else None
        raise ServiceError(f"{what} answered {resp.status_code}: {message or body}")
    return body


def promql(settings: Settings, query: str) -> list[dict[str, Any]]:
    """An instant query's samples: [{'metric': {...}, 'value': float}]."""
    body = _call(settings, "GET", f"{settings.url('prometheus_url')}/api/v1/query",
                 "Prometheus", params={"query": query})
    return [{"metric": s["metric"], "value": float(s["value"][1])}
            for s in body.get("data", {}).get("result", [])]


def remediation_get(settings: Settings, path: str, params: dict[str, Any]) -> Any:
    return _call(settings, "GET", f"{settings.url('remediation_url')}{path}",
                 "the remediation service", params=params,
                 headers={"Authorization": f"Bearer {settings.token()}"})


# --- the data behind the tables -------------------------------------------------------------

def jobs(settings: Settings, since: str = "1h") -> list[dict[str, Any]]:
    """One row per training job Prometheus saw within `since` (a job that just finished or
    died is what on-call asks about, and the exporter drops a finished job's series): its
    ranks and nodes, world size, newest step and its age, whether every rank reported a clean
    finish, and the alerts firing for it or for one of its nodes."""
    def last(name: str) -> str:
        return f"last_over_time({name}[{since}])"

    rows: dict[str, dict[str, Any]] = {}
    for s in promql(settings, last("training_step")):
        job = s["metric"].get("training_job")
        if not job:
            continue
        row = rows.setdefault(job, {"job": job, "ranks": set(), "nodes": set(), "step": 0,
                                    "world_size": None, "last_step_age_seconds": None,
                                    "finished": False, "open_alerts": set()})
        row["ranks"].add(int(s["metric"].get("rank", "-1")))
        if s["metric"].get("node"):
            row["nodes"].add(s["metric"]["node"])
        row["step"] = max(row["step"], int(s["value"]))
    per_job = {
        "world_size": f"max by (training_job) ({last('training_world_size')})",
        "last_step_age_seconds": "time() - max by (training_job) "
                                 f"({last('training_last_step_timestamp_seconds')})",
        "finished": f"min by (training_job) ({last('training_finished')})",
    }
    for key, query in per_job.items():
        for s in promql(settings, query):
            row = rows.get(s["metric"].get("training_job", ""))
            if row is not None:
                row[key] = (int(s["value"]) if key == "world_size" else
                            s["value"] == 1 if key == "finished" else round(s["value"], 1))
    for s in promql(settings, 'ALERTS{alertstate="firing"}'):
        labels = s["metric"]
        for row in rows.values():
            if labels.get("training_job") == row["job"] or (
                    "training_job" not in labels and labels.get("node") in row["nodes"]):
                row["open_alerts"].add(labels["alertname"])
    out = []
    for row in sorted(rows.values(), key=lambda r: r["job"]):
        out.append({**row, "ranks": sorted(row["ranks"]), "nodes": sorted(row["nodes"]),
                    "open_alerts": sorted(row["open_alerts"])})
    return out


def incidents(settings: Settings, state: str | None = None, limit: int = 20
              ) -> list[dict[str, Any]]:
    """Remediation's intents, newest first: the alert, the playbook, its target and what
    happened (state and decision)."""
    params: dict[str, Any] = {"limit": limit}
    if state:
        params["state"] = state
    body = remediation_get(settings, "/v1/actions", params)
    out = []
    for intent in body.get("actions", []):
        labels = intent.get("labels") or {}
        out.append({
            "id": intent["id"], "alert": intent.get("alertname"),
            "playbook": intent.get("playbook") or "-",
            "job": labels.get("training_job"), "target": intent.get("target_key"),
            "phase": intent.get("phase"), "state": intent.get("state"),
            "decision": intent.get("decision"), "acted": bool(intent.get("acted")),
            "created_at": intent.get("created_at"),
        })
    return out


# --- tables -----------------------------------------------------------------------------------

def _cell(value: Any) -> str:
    if value is None or value == [] or value == "":
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """Plain aligned columns (header, then one line per row); `(none)` for no rows."""
    if not rows:
        return "(none)"
    cells = [[title for _, title in columns]]
    cells += [[_cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in cells)


def _ago(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return _duration(time.time() - float(epoch))


def _duration(secs: float) -> str:
    secs = max(secs, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs / size:.0f}{unit}"
    return f"{secs:.0f}s"


JOB_COLUMNS = (("job", "JOB"), ("ranks_text", "RANKS"), ("world_size", "WORLD"),
               ("step", "STEP"), ("last_step", "STEP AGE"), ("state", "STATE"),
               ("nodes", "NODES"), ("open_alerts", "OPEN ALERTS"))
ACTIVE_SECONDS = 120  # a job whose newest step is older than this is shown as `silent`
INCIDENT_COLUMNS = (("id", "ID"), ("alert", "ALERT"), ("playbook", "PLAYBOOK"),
                    ("target", "TARGET"), ("phase", "PHASE"), ("state", "STATE"),
                    ("decision", "DECISION"), ("acted_text", "ACTED"), ("age", "AGE"))


def job_table(rows: list[dict[str, Any]]) -> str:
    shown = [{**r, "ranks_text": f"{len(r['ranks'])} ({_cell(r['ranks'])})",
              "last_step": (None if r["last_step_age_seconds"] is None
                            else _duration(r["last_step_age_seconds"])),
              "state": _state(r)}
             for r in rows]
    return table(shown, JOB_COLUMNS)


def _state(row: dict[str, Any]) -> str:
    if row["finished"]:
        return "finished"
    age = row["last_step_age_seconds"]
    return "stepping" if age is not None and age < ACTIVE_SECONDS else "silent"


def incident_table(rows: list[dict[str, Any]]) -> str:
    return table([{**r, "age": _ago(r["created_at"]), "acted_text": "yes" if r["acted"] else "no"}
                  for r in rows], INCIDENT_COLUMNS)


# --- commands ---------------------------------------------------------------------------------

Printer = Callable[[str], None]


def _since(value: str) -> str:
    """A Prometheus range for last_over_time: digits and one unit, nothing else."""
    if not re.fullmatch(r"[1-9][0-9]{0,5}[smhd]", value):
        raise UsageError(f"--since {value!r}: expected e.g. 15m, 1h, 2d")
    return value


def cmd_status(args: argparse.Namespace, settings: Settings, out: Printer) -> None:
    """The jobs need only Prometheus; the incidents need a token. Without one the jobs are
    still shown, and the incidents' place says what to set."""
    job_rows = jobs(settings, _since(args.since))
    incident_rows: list[dict[str, Any]] | None = None
    why_not = None
    if settings.values.get("token_file"):
        incident_rows = incidents(settings, limit=args.limit)
    else:
        why_not = (f"no token: set {KEYS['token_file'][0]} or `token_file:` in "
                   f"{DEFAULT_CONFIG} to see them")
    if args.json:
        out(json.dumps({"jobs": job_rows, "incidents": incident_rows,
                        **({"incidents_unavailable": why_not} if why_not else {})}, indent=2))
        return
    out(f"JOBS (Prometheus {settings.url('prometheus_url')})")
    out(job_table(job_rows))
    out("")
    out(f"INCIDENTS (remediation {settings.url('remediation_url')}, newest first)")
    out(incident_table(incident_rows) if incident_rows is not None else f"({why_not})")


def cmd_actions(args: argparse.Namespace, settings: Settings, out: Printer) -> None:
    """The service's answer as it is: intents and their audit records, for scripts."""
    params: dict[str, Any] = {"limit": args.limit}
    if args.state:
        params["state"] = args.state
    out(json.dumps(remediation_get(settings, "/v1/actions", params), indent=2))


def cmd_jobs(args: argparse.Namespace, settings: Settings, out: Printer) -> None:
    rows = jobs(settings, _since(args.since))
    out(json.dumps(rows, indent=2) if args.json else job_table(rows))


def cmd_incidents(args: argparse.Namespace, settings: Settings, out: Printer) -> None:
    rows = incidents(settings, args.state, args.limit)
    out(json.dumps(rows, indent=2) if args.json else incident_table(rows))


def cmd_decide(args: argparse.Namespace, settings: Settings, out: Printer) -> None:
    body = _call(settings, "POST", f"{settings.url('remediation_url')}/v1/actions/{args.id}/"
                         f"{args.command}", "the remediation service",
                 headers={"Authorization": f"Bearer {settings.token()}"})
    row = {"id": body.get("id"), "state": body.get("state"), "by": body.get("by")}
    out(json.dumps(row, indent=2) if args.json else
        table([row], (("id", "ID"), ("state", "STATE"), ("by", "BY"))))


def cmd_silence(args: argparse.Namespace, settings: Settings, out: Printer) -> None:
    """One exact-match silence (never a regex: a value cannot widen it to other jobs)."""
    name, value = ("training_job", args.job) if args.job else ("node", args.node)
    try:  # the whole value, in its one spelling (labels.py): never a prefix match
        value = canonical(name, value)
    except LabelError as exc:
        raise UsageError(f"{name} {value!r} is not a label value Trainwatch uses") from exc
    length = silence_seconds(args.duration)
    now = datetime.now(timezone.utc)
    body = {"matchers": [{"name": name, "value": value, "isRegex": False, "isEqual": True}],
            "startsAt": now.isoformat(), "endsAt": (now + timedelta(seconds=length)).isoformat(),
            "createdBy": f"{getpass.getuser()}{CREATED_BY_SUFFIX}",
            "comment": args.comment or f"silenced from the trainwatch CLI for {args.duration}"}
    answer = _alertmanager(settings, "POST", "/silences", json=body)
    row = {"silence_id": answer.get("silenceID"), "matcher": f'{name}="{value}"',
           "ends_at": body["endsAt"]}
    out(json.dumps(row, indent=2) if args.json else
        table([row], (("silence_id", "SILENCE"), ("matcher", "MATCHER"), ("ends_at", "ENDS"))))


def _alertmanager(settings: Settings, method: str, path: str, **kwargs: Any) -> Any:
    return _call(settings, method, f"{settings.url('alertmanager_url')}/api/v2{path}",
                 "Alertmanager", auth=settings.alertmanager_auth(), **kwargs)


def cmd_silences(args: argparse.Namespace, settings: Settings, out: Printer) -> None:
    """The active silences (every author's: what hides an alert matters whoever made it)."""
    rows = []
    for silence in _alertmanager(settings, "GET", "/silences"):
        if silence.get("status", {}).get("state") != "active":
            continue
        matchers = ",".join(
            f'{m["name"]}{"=" if m.get("isEqual", True) else "!"}{"~" if m["isRegex"] else ""}'
            f'"{m["value"]}"' for m in silence.get("matchers", []))
        rows.append({"silence_id": silence["id"], "matchers": matchers,
                     "ends_at": silence.get("endsAt"), "created_by": silence.get("createdBy"),
                     "comment": silence.get("comment")})
    rows.sort(key=lambda r: r["ends_at"] or "")
    out(json.dumps(rows, indent=2) if args.json else
        table(rows, (("silence_id", "SILENCE"), ("matchers", "MATCHERS"), ("ends_at", "ENDS"),
                     ("created_by", "BY"), ("comment", "COMMENT"))))


def cmd_unsilence(args: argparse.Namespace, settings: Settings, out: Printer) -> None:
    """Expire one silence this CLI made, read back first: one a person made in Alertmanager's
    UI, or another system, is theirs to end (exit 2, nothing changed)."""
    silence = _alertmanager(settings, "GET", f"/silence/{args.silence_id}")
    by = str(silence.get("createdBy") or "")
    if not by.endswith(CREATED_BY_SUFFIX):
        raise UsageError(f"silence {args.silence_id} was made by {by!r}, not with this CLI: "
                         "expire it where it was made")
    if silence.get("status", {}).get("state") == "expired":
        raise UsageError(f"silence {args.silence_id} has already expired")
    _alertmanager(settings, "DELETE", f"/silence/{args.silence_id}")
    after = _alertmanager(settings, "GET", f"/silence/{args.silence_id}")
    state = after.get("status", {}).get("state")
    if state != "expired":
        raise ServiceError(f"Alertmanager still shows silence {args.silence_id} as {state}")
    row = {"silence_id": args.silence_id, "state": state}
    out(json.dumps(row, indent=2) if args.json else
        table([row], (("silence_id", "SILENCE"), ("state", "STATE"))))


def cmd_approvers(args: argparse.Namespace, settings: Settings, out: Printer) -> None:
    path = Path(settings.get("approvers_file"))
    try:
        if args.action == "add":
            token = approver_file.add(path, args.name)
            row = {"name": args.name, "token": token}
            out(json.dumps(row, indent=2) if args.json else
                f"approver {args.name} added; their token (shown once, give it to them):\n"
                f"{token}")
        elif args.action == "revoke":
            approver_file.revoke(path, args.name)
            out(json.dumps({"revoked": args.name}) if args.json else
                f"approver {args.name} revoked")
        else:
            names = [{"name": n} for n in approver_file.names(path)]
            out(json.dumps(names, indent=2) if args.json else table(names, (("name", "NAME"),)))
    except (approver_file.ApproverError, OSError) as exc:
        raise UsageError(str(exc)) from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    add_version_argument(parser)
    parser.add_argument("--config", type=Path, default=None,
                        help=f"YAML settings file (default ${ENV_CONFIG}, then {DEFAULT_CONFIG})")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="JSON instead of a table")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", parents=[common], help="jobs, then recent incidents")
    status.add_argument("--limit", type=count, default=10, help="incidents shown (default 10)")
    status.set_defaults(run=cmd_status)
    job_cmd = sub.add_parser("jobs", parents=[common], help="training jobs and their health")
    job_cmd.set_defaults(run=cmd_jobs)
    for p in (status, job_cmd):
        p.add_argument("--since", default="1h",
                       help="jobs seen within this range (default 1h)")
    inc = sub.add_parser("incidents", parents=[common], help="remediation's intents")
    inc.add_argument("--state", help="only this state, e.g. awaiting_approval")
    inc.add_argument("--limit", type=count, default=20)
    inc.set_defaults(run=cmd_incidents)
    act = sub.add_parser("actions", help="the service's intents and audit records, as JSON")
    act.add_argument("--state", help="only this state, e.g. awaiting_approval")
    act.add_argument("--limit", type=count, default=50)
    act.set_defaults(run=cmd_actions)
    for name in ("approve", "reject"):
        p = sub.add_parser(name, parents=[common], help=f"{name} an action awaiting approval")
        p.add_argument("id", type=intent_id)
        p.set_defaults(run=cmd_decide)
    sil = sub.add_parser("silence", parents=[common], help="silence one job's or node's alerts")
    which = sil.add_mutually_exclusive_group(required=True)
    which.add_argument("--job", help="training_job label value")
    which.add_argument("--node", help="node label value")
    sil.add_argument("--for", dest="duration", required=True, help="e.g. 30m, 2h, 1d")
    sil.add_argument("--comment", default="")
    sil.set_defaults(run=cmd_silence)
    sub.add_parser("silences", parents=[common], help="the active silences").set_defaults(
        run=cmd_silences)
    unsil = sub.add_parser("unsilence", parents=[common], help="expire a silence this CLI made")
    unsil.add_argument("silence_id", type=silence_id)
    unsil.set_defaults(run=cmd_unsilence)
    appr = sub.add_parser("approvers", parents=[common], help="the approvers file")
    appr_sub = appr.add_subparsers(dest="action", required=True)
    appr_sub.add_parser("list", parents=[common])
    for action in ("add", "revoke"):
        appr_sub.add_parser(action, parents=[common]).add_argument("name")
    appr.set_defaults(run=cmd_approvers)
    return parser


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config, dict(os.environ if environ is None else environ))
        args.run(args, settings, print)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except ServiceError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
