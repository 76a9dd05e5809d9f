"""Classify a job-stopping fault: which node is suspect, and what to do (fault_classes.yaml).

Two facts live here and nowhere else:

* the fault-class table (remediation/fault_classes.yaml, with its sources: NVIDIA's XID
  catalog for hardware versus application XIDs) maps a signal to a suspect scope and an
  action: quarantine the node and restart the job, restart only, or nothing automatic; and
  each class to the severity of its alerts (the alert rules and the runbook's XID table are
  generated from this module's reading of it);
* the node mapping (inventory host <-> scheduler node name) is the only source of a name that
  reaches a scheduler command. A Slurm hostlist such as `gpu-[01-64]` expands to many nodes,
  exactly like an Ansible host pattern, so a label value is only ever a *key* looked up in the
  mapping: it must be one inventory host of the pool, character for character, and contain no
  hostlist or pattern syntax; the command then gets the mapping's value, never the label.

Everything here is pure (no scheduler, no network): the planner gathers the evidence, this
module decides, so a refusal happens before any command can run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainwatch.remediation.labels import LabelError

DEFAULT_TABLE = Path(__file__).resolve().parent / "fault_classes.yaml"
ACTIONS = ("quarantine", "restart", "none")
SCOPES = ("node", "rank", "suspects", "job")
# The inventory host variable that names a host's node in the scheduler (default: the host's
# own name). Hosts without it are not in the scheduler pool unless the group below holds them.
NODE_VAR = "scheduler_node_name"
POOL_GROUP = "scheduler_nodes"
# What a Slurm hostlist or an Ansible pattern makes of a name: ranges and lists (`[` `]` `,`),
# globs and regexes (`*` `?` `~`), unions and exclusions (`:` `&` `!` `^`), files (`@`),
# quoting and whitespace. A node name holding any of these is refused, from a label or the
# inventory alike.
HOSTLIST_SYNTAX = re.compile(r"[\[\]{},:*?~&!^@=\s\"'\\/$]")
PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,62}$")
# scontrol reads these node names as "every node"
RESERVED_NAMES = frozenset({"all", "localhost"})
# A scheduler job id a rank's environment may carry into a stall record (digits only)
SCHEDULER_JOB_ID = re.compile(r"^[0-9]{1,12}$")


class FaultTableError(ValueError):
    """fault_classes.yaml cannot be used; the message names the file and the key."""


class NodeNameError(LabelError):
    """A node name that is not exactly one node of the mapping; the message is the audit reason
    (a LabelError: the engine refuses the intent before anything runs, and never retries)."""


@dataclass(frozen=True)
class FaultClass:
    name: str
    action: str
    description: str
    severity: str  # the `severity` label of the class's alerts
    advice: str = ""  # what on-call does, where an XID of the class gives no advice of its own
    # The fault ends the job before any alert (a killed rank): only a job that already
    # ended is restarted, never another job running on the same node.
    ends_job: bool = False


@dataclass(frozen=True)
class Signal:
    alertname: str
    fault_class: str  # a class name, or "by_xid"
    scope: str
    needs_ranks: bool = False
    # The class when the alert names no rank (scope `rank`): the evidence that tells a rank
    # killed from outside from a job that ended by its own error.
    without_rank: str | None = None


@dataclass(frozen=True)
class XidEntry:
    xid: int
    fault_class: str
    mnemonic: str
    meaning: str
    advice: str = ""  # empty: the class's advice


@dataclass(frozen=True)
class FaultTable:
    classes: Mapping[str, FaultClass]
    xids: Mapping[int, XidEntry]
    unknown_xid: str
    signals: Mapping[str, Signal]
    sources: Mapping[str, str]

    def xid_class(self, xid: int) -> str:
        entry = self.xids.get(xid)
        return entry.fault_class if entry else self.unknown_xid

    def xids_of(self, cls: str) -> tuple[int, ...]:
        """The listed XIDs of class `cls`, ascending (unknown XIDs are `unknown_xid`'s too)."""
        return tuple(sorted(x for x, entry in self.xids.items() if entry.fault_class == cls))

    def xid_classes(self) -> tuple[str, ...]:
        """The classes an XID can fall in (a listed one's, or `unknown_xid`), in table order."""
        used = {entry.fault_class for entry in self.xids.values()} | {self.unknown_xid}
        return tuple(name for name in self.classes if name in used)


def load_table(path: Path = DEFAULT_TABLE) -> FaultTable:
    """Read and check the table: every class an XID or signal names exists, every action and
    scope is known, every source is given. A bad table stops the service at start."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FaultTableError(f"{path}: cannot read: {exc}") from exc
    if not isinstance(doc, dict):
        raise FaultTableError(f"{path}: not a mapping")
    for key in ("sources", "classes", "xids", "signals", "unknown_xid"):
        if key not in doc:
            raise FaultTableError(f"{path}: {key}: missing")
    if "xid_catalog" not in doc["sources"]:
        raise FaultTableError(f"{path}: sources/xid_catalog: the XID classes need their source")
    classes: dict[str, FaultClass] = {}
    for name, spec in doc["classes"].items():
        if spec.get("action") not in ACTIONS:
            raise FaultTableError(f"{path}: classes/{name}/action: one of {ACTIONS}")
        if not isinstance(spec.get("severity"), str) or not spec["severity"]:
            raise FaultTableError(f"{path}: classes/{name}/severity: the alerts' severity label")
        classes[name] = FaultClass(name, spec["action"], str(spec.get("description", "")),
                                   spec["severity"], str(spec.get("advice", "")),
                                   bool(spec.get("ends_job", False)))

    def known(cls: str, where: str) -> str:
        if cls not in classes:
            raise FaultTableError(f"{path}: {where}: unknown class {cls!r}")
        return cls

    xids = {}
    for xid, spec in doc["xids"].items():
        if not isinstance(xid, int) or xid <= 0:
            raise FaultTableError(f"{path}: xids/{xid}: an XID is a positive integer")
        xids[xid] = XidEntry(xid, known(spec.get("class", ""), f"xids/{xid}/class"),
                             str(spec.get("mnemonic", "")), str(spec.get("meaning", "")),
                             str(spec.get("advice", "")))
    signals = {}
    for alertname, spec in doc["signals"].items():
        cls = spec.get("class", "")
        if cls != "by_xid":
            known(cls, f"signals/{alertname}/class")
        if spec.get("scope") not in SCOPES:
            raise FaultTableError(f"{path}: signals/{alertname}/scope: one of {SCOPES}")
        without_rank = spec.get("without_rank")
        if without_rank is not None:
            known(without_rank, f"signals/{alertname}/without_rank")
        signals[alertname] = Signal(alertname, cls, spec["scope"], bool(spec.get("needs_ranks")),
                                    without_rank)
    return FaultTable(classes=classes, xids=xids,
                      unknown_xid=known(doc["unknown_xid"], "unknown_xid"), signals=signals,
                      sources={k: str(v) for k, v in doc["sources"].items()})


def check_plain_name(name: object, what: str) -> str:
    """`name` as a plain node name, or NodeNameError: no hostlist/pattern syntax, no option."""
    if not isinstance(name, str) or not name:
        raise NodeNameError(f"{what}: no node name")
    if HOSTLIST_SYNTAX.search(name):
        raise NodeNameError(f"{what} {name!r} holds hostlist or pattern syntax: refused")
    if not PLAIN_NAME.match(name) or name.lower() in RESERVED_NAMES:
        raise NodeNameError(f"{what} {name!r} is not a plain node name: refused")
    return name


@dataclass(frozen=True)
class NodeMap:
    """Inventory host <-> scheduler node name, for the hosts of the scheduler pool.

    Built from the Ansible inventory (trainwatch.remediation.inventory parses it with Ansible's own
    parser): a host is in the pool when it sets `scheduler_node_name` or is in the
    `scheduler_nodes` group; its node name is that variable, else its inventory name.
    """

    to_node: Mapping[str, str]

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for host, node in self.to_node.items():
            check_plain_name(host, "inventory host")
            check_plain_name(node, f"scheduler node of {host}")
            if node in seen:
                raise NodeNameError(f"hosts {seen[node]!r} and {host!r} map to one scheduler "
                                    f"node {node!r}")
            seen[node] = host

    @property
    def pool(self) -> tuple[str, ...]:
        """Every scheduler node of the pool, sorted."""
        return tuple(sorted(self.to_node.values()))

    def host_of(self, node: str) -> str | None:
        return next((h for h, n in self.to_node.items() if n == node), None)

    def node_for(self, value: object, what: str = "node label") -> str:
        """The scheduler node of the inventory host `value` names exactly; NodeNameError for a
        pattern, a hostlist or a name outside the mapping."""
        name = check_plain_name(value, what)
        if name not in self.to_node:
            raise NodeNameError(f"{what} {name!r} is not a host of the scheduler node mapping")
        return self.to_node[name]

    @classmethod
    def from_inventory(cls, inventory: Path | None, state: Path) -> NodeMap:
        from trainwatch.remediation.inventory import TargetError, _load

        if inventory is None:
            raise NodeNameError("no ansible_inventory is configured: no node mapping, "
                                "scheduler actions are refused")
        try:
            manager = _load(inventory, state)
        except TargetError as exc:
            raise NodeNameError(str(exc)) from exc
        pool_group = manager.groups.get(POOL_GROUP)
        in_group = {h.name for h in pool_group.get_hosts()} if pool_group else set()
        mapping = {}
        for name, host in manager.hosts.items():
            node = host.vars.get(NODE_VAR)
            if node is not None or name in in_group:
                mapping[name] = str(node) if node is not None else name
        return cls(mapping)


@dataclass(frozen=True)
class Evidence:
    """What the planner learned besides the labels (each node name still goes through the
    mapping): the nodes the stall's suspects run on (the diagnostics' record), whether the
    node of a NodeDown hosts ranks, and the scheduler's jobs on the suspect node."""

    suspect_nodes: tuple[str, ...] | None = None
    node_hosts_ranks: bool | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Fault:
    """The decision: what to do, to which scheduler nodes, and why (for the audit)."""

    alertname: str
    fault_class: str
    action: str  # quarantine | restart | none
    nodes: tuple[str, ...]  # scheduler node names, from the mapping only
    reason: str
    xid: int | None = None
    ends_job: bool = False  # the class's: restart only a job that already ended

    def as_dict(self) -> dict[str, Any]:
        return {"alertname": self.alertname, "class": self.fault_class, "action": self.action,
                "nodes": list(self.nodes), "reason": self.reason, "xid": self.xid,
                "ends_job": self.ends_job}


def _xid_of(labels: Mapping[str, str]) -> int:
    raw = labels.get("xid", "")
    if not raw.isdigit() or len(raw) > 6:
        raise LabelError("label 'xid' is not a decimal XID")
    return int(raw)


def classify(table: FaultTable, labels: Mapping[str, str], nodes: NodeMap,
             evidence: Evidence = Evidence()) -> Fault:
    """The fault an alert stands for. LabelError (NodeNameError) when a node the decision
    depends on is not exactly one node of the mapping: refused before any command runs."""
    alertname = labels.get("alertname", "")
    signal = table.signals.get(alertname)
    if signal is None:
        raise LabelError(f"alert {alertname!r} is not in the fault-class table")
    xid = None
    cls = signal.fault_class
    if cls == "by_xid":
        xid = _xid_of(labels)
        cls = table.xid_class(xid)
    if signal.without_rank is not None and not labels.get("rank"):
        cls = signal.without_rank
    action = table.classes[cls].action
    why = table.classes[cls].description
    if xid is not None:
        entry = table.xids.get(xid)
        why = f"XID {xid} ({entry.mnemonic if entry else 'not in the table'}): {why}"
    if action == "none":
        return Fault(alertname, cls, "none", (), why, xid)
    if signal.scope == "job":
        return Fault(alertname, cls, "restart", (), why, xid)
    if signal.scope == "suspects" and evidence.suspect_nodes:
        suspects = tuple(sorted({nodes.node_for(n, "suspect node")
                                 for n in evidence.suspect_nodes}))
    else:  # node, rank, or suspects without a diagnostics record: the alert's node
        suspects = (nodes.node_for(labels.get("node"), "node label"),)
    if signal.needs_ranks and evidence.node_hosts_ranks is False:
        return Fault(alertname, cls, "none", suspects,
                     f"{why}; the node hosts no job's ranks: nothing to restart", xid)
    if action == "quarantine" and len(suspects) > 1:
        return Fault(alertname, cls, "restart", suspects,
                     f"{why}; the evidence points at {len(suspects)} nodes, so none is "
                     "drained: the job restarts on the same pool", xid)
    return Fault(alertname, cls, action, suspects, why, xid, table.classes[cls].ends_job)


# The fields of a stall diagnostics record (exporters/node/tools/stack_dump.py analyse) that
# name the ranks the stall is blamed on, one per kind of hang, as an older record without
# `suspects` has them: stopped by a signal, never entered the collective the others wait in,
# inside another collective than most; failing these, silent (no flight-recorder dump while a
# peer wrote one).
HANG_KINDS = ("stopped", "not_entered", "elsewhere")


def suspect_ranks(record: Mapping[str, Any]) -> tuple[str, ...]:
    """The ranks a stall diagnostics record blames (`collectives.suspects`, else every hang
    kind's field of an older record), as decimal strings."""
    collectives = record.get("collectives") or {}
    if not isinstance(collectives, Mapping):
        return ()
    ranks: Iterable[Any] | None = collectives.get("suspects")
    if ranks is None:
        named = [r for kind in HANG_KINDS for r in collectives.get(kind) or ()]
        ranks = named or collectives.get("silent") or ()
    return tuple(sorted({str(r) for r in ranks if str(r).isdigit()}, key=int))


def suspects_from_record(record: Mapping[str, Any],
                         rank_nodes: Mapping[int, str | Iterable[str]]) -> tuple[str, ...]:
    """The nodes of the ranks a stall diagnostics record blames (every hang kind: stopped,
    not entered, elsewhere, silent), through the job's rank -> node table; unknown ranks are
    left out. A rank found on more than one node names each of them."""
    nodes: set[str] = set()
    for rank in suspect_ranks(record):
        where = rank_nodes.get(int(rank))
        if where is not None:
            nodes.update((where,) if isinstance(where, str) else where)
    return tuple(sorted(nodes))


@dataclass(frozen=True)
class StallRecord:
    """Every node's stall diagnostics of one job, merged: the analysis run again over all
    their rank processes (one node sees only its own ranks, so only the merge can tell which
    rank the others wait for), the rank -> node table (the inventory host whose record holds
    the rank's process), and the hosts whose record could not be read."""

    collectives: Mapping[str, Any]
    rank_hosts: Mapping[int, tuple[str, ...]]
    unreadable: tuple[str, ...] = ()
    # the Slurm job ids the ranks' environments carry (SLURM_JOB_ID): the stall's own job
    scheduler_jobs: tuple[str, ...] = ()

    @property
    def suspect_hosts(self) -> tuple[str, ...]:
        return suspects_from_record({"collectives": self.collectives}, self.rank_hosts)

    def as_dict(self) -> dict[str, Any]:
        return {"suspect_ranks": list(suspect_ranks({"collectives": self.collectives})),
                "suspect_hosts": list(self.suspect_hosts),
                "rank_hosts": {str(r): list(h) for r, h in sorted(self.rank_hosts.items())},
                "collectives": dict(self.collectives), "unreadable": list(self.unreadable),
                "scheduler_jobs": list(self.scheduler_jobs)}


def merge_records(by_host: Mapping[str, Mapping[str, str]]) -> StallRecord | None:
    """The stall record of a job from the `ansible` action's `captured_by_host` of the
    stalled_job_diagnostics playbook ({host: {task: stack_dump's JSON line}}); None when no
    host's record holds a rank process."""
    from trainwatch.exporters.node.tools.stack_dump import analyse

    processes: list[dict[str, Any]] = []
    rank_hosts: dict[int, set[str]] = {}
    scheduler_jobs: set[str] = set()
    unreadable = []
    for host, tasks in sorted(by_host.items()):
        found = False
        for text in tasks.values():
            try:
                doc = json.loads(text)
            except (TypeError, ValueError):
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("processes"), list):
                continue
            found = True
            for proc in doc["processes"]:
                rank = proc.get("rank") if isinstance(proc, dict) else None
                if not (isinstance(rank, str) and rank.isdigit() and len(rank) < 8):
                    continue
                processes.append({"rank": rank, "state": proc.get("state"),
                                  "flight_recorder": _recorder(proc.get("flight_recorder"))})
                rank_hosts.setdefault(int(rank), set()).add(host)
                job = proc.get("scheduler_job")
                if isinstance(job, str) and SCHEDULER_JOB_ID.match(job):
                    scheduler_jobs.add(job)
        if not found:
            unreadable.append(host)
    if not processes:
        return None
    return StallRecord(analyse(processes),
                       {r: tuple(sorted(h)) for r, h in rank_hosts.items()}, tuple(unreadable),
                       tuple(sorted(scheduler_jobs)))


def _recorder(summary: Any) -> dict[str, Any] | str:
    """A rank's flight-recorder summary as analyse reads it, or a string (no usable dump)."""
    if not isinstance(summary, dict):
        return str(summary)[:200]
    seq = summary.get("last_seq")
    flight = summary.get("in_flight")
    if (seq is not None and not isinstance(seq, int)) or not isinstance(flight, list) or any(
            not isinstance(e, dict) for e in flight):
        return "unreadable flight recorder summary"
    cid = summary.get("collective_id", 0)
    return {"last_seq": seq, "in_flight": [{"seq": e.get("seq")} for e in flight],
            "collective_id": cid if isinstance(cid, int) else 0}
