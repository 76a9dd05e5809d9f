"""The fault-class table and classification (remediation/faults.py, fault_classes.yaml): which
signal is the node's fault, which the job's, and that no label ever becomes a node pattern."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainwatch.exporters.node.tools.stack_dump import analyse, fit, summarise_recorder
from trainwatch.remediation.actions.quarantine import EvidencePending, find_diagnostics
from trainwatch.remediation.faults import (
    DEFAULT_TABLE,
    Evidence,
    FaultTableError,
    NodeMap,
    NodeNameError,
    classify,
    load_table,
    merge_records,
    suspects_from_record,
)
from trainwatch.remediation.labels import LabelError

TABLE = load_table()
NODES = NodeMap({"node-a": "tw-gpu-01", "node-b": "tw-gpu-02", "node-c": "tw-gpu-03"})


def alert(name: str, **labels: str) -> dict[str, str]:
    return {"alertname": name, **labels}


@pytest.mark.parametrize("xid", [46, 48, 62, 64, 74, 79, 95, 119, 120])
def test_hardware_xids_quarantine_the_node(xid: int) -> None:
    fault = classify(TABLE, alert("GpuXidErrors", node="node-b", gpu="0", xid=str(xid)), NODES)
    assert (fault.fault_class, fault.action, fault.nodes) == ("hardware", "quarantine",
                                                              ("tw-gpu-02",))
    assert f"XID {xid}" in fault.reason


@pytest.mark.parametrize("xid", [13, 31, 43, 45])
def test_application_xids_never_blame_the_node(xid: int) -> None:
    fault = classify(TABLE, alert("GpuXidErrors", node="node-b", gpu="0", xid=str(xid)), NODES)
    assert (fault.fault_class, fault.action, fault.nodes) == ("application", "none", ())


def test_contained_and_unknown_xids() -> None:
    contained = classify(TABLE, alert("GpuXidErrors", node="node-a", xid="94"), NODES)
    assert (contained.action, contained.nodes) == ("restart", ("tw-gpu-01",))
    unknown = classify(TABLE, alert("GpuXidErrors", node="node-a", xid="9999"), NODES)
    assert (unknown.fault_class, unknown.action) == ("watch", "none")
    with pytest.raises(LabelError, match="xid"):
        classify(TABLE, alert("GpuXidErrors", node="node-a", xid="79;reboot"), NODES)


@pytest.mark.parametrize("name", ["GpuLost", "GpuEccUncorrectableErrors", "GpuRowRemapFailure"])
def test_gpu_hardware_signals(name: str) -> None:
    fault = classify(TABLE, alert(name, node="node-c", gpu="1"), NODES)
    assert (fault.action, fault.nodes) == ("quarantine", ("tw-gpu-03",))


def test_node_down_only_when_it_hosts_ranks() -> None:
    labels = alert("NodeDown", node="node-a")
    assert classify(TABLE, labels, NODES, Evidence(node_hosts_ranks=True)).action == "quarantine"
    idle = classify(TABLE, labels, NODES, Evidence(node_hosts_ranks=False))
    assert idle.action == "none" and "hosts no job" in idle.reason


def test_stall_suspects_on_one_node_quarantine_it_on_two_restart_only() -> None:
    labels = alert("TrainingStalled", training_job="j", rank="1", node="node-a")
    one = classify(TABLE, labels, NODES, Evidence(suspect_nodes=("node-b", "node-b")))
    assert (one.action, one.nodes) == ("quarantine", ("tw-gpu-02",))
    two = classify(TABLE, labels, NODES, Evidence(suspect_nodes=("node-a", "node-b")))
    assert (two.action, two.nodes) == ("restart", ("tw-gpu-01", "tw-gpu-02"))
    assert "none is drained" in two.reason
    # no diagnostics record yet: the rank the alert names
    assert classify(TABLE, labels, NODES).nodes == ("tw-gpu-01",)


def test_nccl_rank_and_vanished_job() -> None:
    nccl = classify(TABLE, alert("TrainingNcclError", training_job="j", rank="3", node="node-c"),
                    NODES)
    assert (nccl.fault_class, nccl.action, nccl.nodes) == ("hang", "quarantine", ("tw-gpu-03",))



def test_vanished_job_with_a_killed_rank_restarts_on_its_node_without_one_pages() -> None:
    """A rank that died without a word (killed) names its node: the job that ran there is
    restarted, nothing drained. No rank named: every rank reported its own error (a
    traceback) or the job was stopped whole: not restarted."""
    killed = classify(TABLE, alert("TrainingJobVanished", training_job="j", rank="1",
                                   node="node-b"), NODES)
    assert (killed.fault_class, killed.action, killed.nodes) == ("killed", "restart",
                                                                 ("tw-gpu-02",))
    own = classify(TABLE, alert("TrainingJobVanished", training_job="j"), NODES)
    assert (own.fault_class, own.action, own.nodes) == ("ended_itself", "none", ())


def test_suspects_from_diagnostics_record() -> None:
    record = {"collectives": {"not_entered": [1, "3", "x"]}}
    assert suspects_from_record(record, {0: "node-a", 1: "node-b", 3: "node-b"}) == ("node-b",)


# --- a stall's diagnostics record -> its suspects, for every kind of hang stack_dump tells ----
# (issue 23 acceptance 2; the kinds are issue 28's, tests/training/test_hang_kinds.py)

def entry(group: str, seq: int, *, retired: bool = True) -> dict[str, Any]:
    return {"process_group": [group, "desc"], "collective_seq_id": seq, "retired": retired,
            "profiling_name": "gloo:all_reduce", "time_created_ns": 1_700_000_000_000_000_000,
            "is_p2p": False}


DONE = [entry("0", 1), entry("0", 2), entry("1", 1)]
WAITING = [*DONE, entry("0", 3, retired=False)]  # inside the step's all-reduce


def rank(number: int, entries: list[dict[str, Any]] | None, state: str = "S"
         ) -> dict[str, Any]:
    """A rank process as stack_dump reports it (None: no flight-recorder dump)."""
    recorder: Any = (summarise_recorder({"entries": entries}) if entries is not None
                     else "no flight recorder dump (No such file or directory)")
    return {"pid": 1000 + number, "rank": str(number), "state": state,
            "flight_recorder": recorder, "dump": "Thread 1 (idle)"}


def node_record(*procs: dict[str, Any]) -> str:
    """One node's stack_dump output line: its own ranks only, analysed on that node."""
    return fit({"job": "j", "collectives": analyse(list(procs)), "processes": list(procs)})


def by_host(**hosts: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The ansible action's captured_by_host for the diagnostics playbook."""
    return {host.replace("_", "-"): {"Capture: py-spy dump of every rank process":
                                     node_record(*procs)} for host, procs in hosts.items()}


HANGS = {
    # SIGSTOP: the process is stopped (state T) and writes no dump; its peer waits
    "stopped": by_host(node_a=[rank(0, WAITING)], node_b=[rank(1, None, state="T")]),
    # blocked before the step's collective: its sequence is behind its peers'
    "not_entered": by_host(node_a=[rank(0, WAITING), rank(1, WAITING)],
                           node_b=[rank(2, DONE), rank(3, WAITING)]),
    # inside another group's collective while the others wait in the step's (equal default
    # group sequence numbers: not_entered cannot tell)
    "elsewhere": by_host(node_a=[rank(0, WAITING), rank(1, WAITING)],
                         node_b=[rank(2, [*DONE, entry("0", 3), entry("1", 2, retired=False)]),
                                 rank(3, WAITING)]),
    # alive but its monitor thread wrote no dump while its peers did
    "silent": by_host(node_a=[rank(0, WAITING), rank(1, WAITING)],
                      node_b=[rank(2, None), rank(3, WAITING)]),
}


@pytest.mark.parametrize("kind", list(HANGS))
def test_every_kind_of_hang_names_its_node_from_the_merged_record(kind: str) -> None:
    """Each node's record sees only its own ranks; merged, the rank the others wait for is
    named, and its node (the host whose record holds its process) is the one suspect."""
    record = merge_records(HANGS[kind])
    assert record is not None
    assert record.suspect_hosts == ("node-b",), record.as_dict()
    labels = alert("TrainingStalled", training_job="j", rank="0", node="node-a")
    fault = classify(TABLE, labels, NODES, Evidence(suspect_nodes=record.suspect_hosts))
    assert (fault.action, fault.nodes) == ("quarantine", ("tw-gpu-02",))


def test_the_older_record_fields_of_every_kind_name_suspects() -> None:
    """A record from a node tool without `suspects`: each hang kind's field counts, not only
    `not_entered` (the code before issue 23 acceptance 2 read only that one)."""
    table = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-c"}
    assert suspects_from_record({"collectives": {"elsewhere": ["2"]}}, table) == ("node-b",)
    assert suspects_from_record({"collectives": {"stopped": ["3"]}}, table) == ("node-c",)
    silent = {"collectives": {"silent": ["3"], "not_entered": ["1"]}}
    assert suspects_from_record(silent, table) == ("node-a",), "silent only failing the rest"
    assert suspects_from_record({"collectives": {"silent": ["3"]}}, table) == ("node-c",)
    assert suspects_from_record({"collectives": {"suspects": ["0", "2"]}}, table) == (
        "node-a", "node-b")


def test_evidence_on_both_nodes_restarts_without_draining() -> None:
    """One rank stopped on each node: both nodes suspect, so the job restarts, no drain."""
    record = merge_records(by_host(node_a=[rank(0, WAITING), rank(1, None, state="T")],
                                   node_b=[rank(2, WAITING), rank(3, None, state="T")]))
    assert record is not None and record.suspect_hosts == ("node-a", "node-b")
    labels = alert("TrainingStalled", training_job="j", rank="1", node="node-a")
    fault = classify(TABLE, labels, NODES, Evidence(suspect_nodes=record.suspect_hosts))
    assert (fault.action, fault.nodes) == ("restart", ("tw-gpu-01", "tw-gpu-02"))


def test_half_the_ranks_stopped_names_the_stopped_not_the_waiting() -> None:
    """Two ranks stopped by a signal after they queued their next collective (seq 4, a dump
    written before the stop), two ranks waiting in seq 3 for them: the waiting ranks look
    "not entered", yet the stopped ranks are where the job stopped. Only they are named, so
    only their node is suspect."""
    ahead = [*WAITING, entry("0", 4, retired=False)]
    record = merge_records(by_host(node_a=[rank(0, WAITING), rank(1, WAITING)],
                                   node_b=[rank(2, ahead, state="T"),
                                           rank(3, ahead, state="T")]))
    assert record is not None
    assert record.collectives["suspects"] == ["2", "3"], record.as_dict()
    assert record.suspect_hosts == ("node-b",)


def test_the_record_names_the_stalled_ranks_slurm_job() -> None:
    """The ranks' SLURM_JOB_ID (stack_dump reads it from their environment) is the stall's
    own Slurm job: the quarantine requeues that job, not every job on the node."""
    procs = [{**rank(0, WAITING), "scheduler_job": "41"},
             {**rank(1, None, state="T"), "scheduler_job": "41"},
             {**rank(2, WAITING), "scheduler_job": "41;rm"}]  # not a job id: left out
    record = merge_records(by_host(node_a=procs[:1], node_b=procs[1:]))
    assert record is not None and record.scheduler_jobs == ("41",)
    assert record.as_dict()["scheduler_jobs"] == ["41"]


def test_a_record_host_outside_the_mapping_is_refused() -> None:
    record = merge_records(by_host(node_d=[rank(0, None, state="T")], node_a=[rank(1, WAITING)]))
    assert record is not None and record.suspect_hosts == ("node-d",)
    with pytest.raises(NodeNameError):
        classify(TABLE, alert("TrainingStalled", training_job="j", rank="0", node="node-a"),
                 NODES, Evidence(suspect_nodes=record.suspect_hosts))


def test_unreadable_records_name_nobody() -> None:
    assert merge_records({"node-a": {"Capture: x": "not json"}}) is None
    record = merge_records({"node-a": {"Capture: x": "{\"processes\": [{\"rank\": \"0;x\"}]}"},
                            **by_host(node_b=[rank(1, None, state="T")]),
                            "node-c": {"Capture: x": "[1]"}})
    assert record is not None
    assert record.suspect_hosts == ("node-b",) and record.unreadable == ("node-c",)


def test_a_long_record_stays_one_parseable_line() -> None:
    """stack_dump cuts the py-spy dumps so the line fits the action's capture limit (which
    keeps the tail: a longer line would lose its start and not parse)."""
    from trainwatch.remediation.actions.ansible import OUTPUT_LIMIT

    procs = [dict(rank(n, WAITING), dump="frame\n" * 5000) for n in range(8)]
    line = node_record(*procs)
    assert len(line) <= OUTPUT_LIMIT
    assert [p["rank"] for p in json.loads(line)["processes"]] == [str(n) for n in range(8)]


def diag_row(intent_id: int, state: str, decision: str | None,
             captured: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    results = [] if captured is None else [
        {"step": 0, "action": "ansible", "result": {"captured_by_host": captured}}]
    return {"id": intent_id, "state": state, "decision": decision, "results": json.dumps(results)}


def test_the_quarantine_waits_for_the_diagnostics_then_reads_them() -> None:
    """A stall's quarantine decides on the job's diagnostics record: it waits while the
    diagnostics may still act, skips those cooled down, and without one falls back to the
    alert's own rank."""
    acted = diag_row(3, "done", "act", HANGS["stopped"])
    with pytest.raises(EvidencePending):
        find_diagnostics([diag_row(4, "running", "act"), acted], waited=5, wait_limit=60)
    with pytest.raises(EvidencePending):
        find_diagnostics([diag_row(4, "pending", None)], waited=5, wait_limit=60)
    found = find_diagnostics([diag_row(5, "done", "cooled_down"), acted], waited=5,
                             wait_limit=60)
    assert found.intent_id == 3 and found.record is not None
    assert found.as_dict()["record"]["suspect_hosts"] == ["node-b"]
    late = find_diagnostics([diag_row(4, "running", "act")], waited=61, wait_limit=60)
    assert late.record is None and "[4] still unfinished" in late.note
    assert find_diagnostics([], waited=0, wait_limit=60).record is None


@pytest.mark.parametrize("value", [
    "gpu-[01-64]", "node-a,node-b", "node-*", "~node.*", "node-a:node-b", "all", "ALL",
    "!node-a", "-node-a", "node a", "", "node-d", "tw-gpu-01", "@/etc/hosts", "node-a^",
])
def test_a_label_that_is_a_pattern_or_unknown_is_refused(value: str) -> None:
    """Hostlists, patterns, reserved names, option-like names and names outside the mapping
    (a scheduler node name given as a label too: only inventory hosts are keys) are refused."""
    with pytest.raises(NodeNameError):
        classify(TABLE, alert("GpuLost", node=value, gpu="0"), NODES)
    with pytest.raises(NodeNameError):
        classify(TABLE, alert("TrainingStalled", node="node-a"), NODES,
                 Evidence(suspect_nodes=("node-a", value)))


def test_mapping_values_are_checked_too() -> None:
    with pytest.raises(NodeNameError, match="hostlist"):
        NodeMap({"node-a": "tw-gpu-[01-03]"})
    with pytest.raises(NodeNameError, match="one scheduler node"):
        NodeMap({"node-a": "n1", "node-b": "n1"})


def test_mapping_from_a_real_inventory(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "hosts": {"node-a": {"scheduler_node_name": "tw-gpu-01"}, "monitor": {}},
        "children": {"scheduler_nodes": {"hosts": {"node-b": {}}}}}}))
    nodes = NodeMap.from_inventory(inventory, tmp_path / "state")
    assert dict(nodes.to_node) == {"node-a": "tw-gpu-01", "node-b": "node-b"}
    assert nodes.pool == ("node-b", "tw-gpu-01")
    with pytest.raises(NodeNameError, match="not a host"):
        nodes.node_for("monitor")


def test_table_is_checked(tmp_path: Path) -> None:
    doc = yaml.safe_load(DEFAULT_TABLE.read_text())
    doc["xids"][79]["class"] = "broken"
    bad = tmp_path / "t.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(FaultTableError, match="xids/79/class"):
        load_table(bad)
    doc = yaml.safe_load(DEFAULT_TABLE.read_text())
    del doc["classes"]["hardware"]["severity"]
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(FaultTableError, match="classes/hardware/severity"):
        load_table(bad)
    assert "docs.nvidia.com/deploy/xid-errors" in TABLE.sources["xid_catalog"]


def test_stack_dump_sees_a_stopped_rank_and_only_its_nodes_ranks(tmp_path: Path) -> None:
    """Real processes: a rank stopped with SIGSTOP is `T` in its record, and a rank the
    scheduler started for another node on the same machine is left out (the test cluster's
    nodes share one machine)."""
    import os
    import signal
    import subprocess
    import sys

    from tests.support.net import wait_until
    from trainwatch.exporters.node.tools.stack_dump import rank_processes

    job = f"sd-{os.getpid()}"
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={
        **os.environ, "RANK": str(rank), "TRAINWATCH_JOB": job, "SLURMD_NODENAME": node})
        for rank, node in ((0, "tw-gpu-01"), (1, "tw-gpu-02"))]
    try:
        os.kill(procs[1].pid, signal.SIGSTOP)
        found = wait_until(lambda: (lambda f: f if f and f[0]["state"] == "T" else None)(
            rank_processes(job, "tw-gpu-02")), timeout=10, what="the stopped rank")
        assert [(p["rank"], p["pid"]) for p in found] == [("1", procs[1].pid)]
        assert [p["state"] for p in rank_processes(job, "tw-gpu-01")] != ["T"]
        assert sorted(p["rank"] for p in rank_processes(job)) == ["0", "1"]
        record = analyse(rank_processes(job))
        assert record["stopped"] == ["1"] and record["suspects"] == ["1"]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
