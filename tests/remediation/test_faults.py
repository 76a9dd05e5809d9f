"""The fault-class table and classification (remediation/faults.py, fault_classes.yaml): which
signal is the node's fault, which the job's, and that no label ever becomes a node pattern."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from remediation.faults import (
    DEFAULT_TABLE,
    Evidence,
    FaultTableError,
    NodeMap,
    NodeNameError,
    classify,
    load_table,
    suspects_from_record,
)
from remediation.labels import LabelError

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
    gone = classify(TABLE, alert("TrainingJobVanished", training_job="j"), NODES)
    assert (gone.action, gone.nodes) == ("restart", ())


def test_suspects_from_diagnostics_record() -> None:
    record = {"collectives": {"not_entered": [1, "3", "x"]}}
    assert suspects_from_record(record, {0: "node-a", 1: "node-b", 3: "node-b"}) == ("node-b",)


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
    assert "docs.nvidia.com/deploy/xid-errors" in TABLE.sources["xid_catalog"]
