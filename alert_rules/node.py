"""Node alerts from node_exporter: disks, memory, and the host being unreachable."""

from __future__ import annotations

from alert_rules import recording
from alert_rules.config import Profile
from alert_rules.model import Alert, Group, alert_groups
from alert_rules.promql import sel, with_node
from trainwatch.exporters.contract import catalog

FS = "{{ $labels.mountpoint }} on {{ $labels.node }}"


def groups(p: Profile) -> list[Group]:
    node, fs = p.selector("node"), p.selector("filesystem")
    avail, size = sel(catalog.NODE_FS_AVAIL, node, fs), sel(catalog.NODE_FS_SIZE, node, fs)
    writable = f"{sel(catalog.NODE_FS_READONLY, node, fs)} == 0"
    filling = p.alert("NodeDiskFilling")
    predicted = p.alert("NodeDiskFillingPredicted")
    memory = p.alert("NodeMemoryHigh")
    alerts = [
        Alert(
            "NodeDiskFilling",
            with_node(f"({avail} / {size} < {filling['threshold_ratio']}\nand\n{writable})"),
            "warning", "node",
            f"{FS} has {{{{ $value | humanizePercentage }}}} space left",
            f"Filesystem {FS} has less than {filling['threshold_ratio'] * 100:g}% free space. "
            "Checkpoint writes and logs fail when it is full, which kills the job. Trainwatch "
            "removes old checkpoints and rotated logs automatically (disk_cleanup playbook).",
            for_=filling["for"],
        ),
        Alert(
            "NodeDiskFillingPredicted",
            with_node(f"({avail} / {size} < {predicted['below_ratio']}\nand\n"
                      f"predict_linear({avail}[{predicted['trend_window']}], "
                      f"{predicted['horizon_seconds']}) < 0\nand\n{writable})"),
            "warning", "node",
            f"{FS} will be full within {predicted['horizon_seconds'] // 3600 or 1}h at this rate",
            f"At the write rate of the last {predicted['trend_window']}, filesystem {FS} "
            f"(now {{{{ $value | humanizePercentage }}}} free) runs out of space within "
            f"{predicted['horizon_seconds']} s. Trainwatch's disk_cleanup playbook runs "
            "automatically; check checkpoint retention if the trend continues.",
            for_=predicted["for"],
        ),
        Alert(
            "NodeMemoryHigh",
            with_node(f"{recording.NODE_MEMORY_UTILISATION}{{{node}}} > "
                      f"{memory['threshold_ratio']}"),
            "warning", "node",
            "{{ $labels.node }} memory is {{ $value | humanizePercentage }} used",
            f"Host memory on {{{{ $labels.node }}}} has been above "
            f"{memory['threshold_ratio'] * 100:g}% for {memory['for']}. The kernel OOM killer "
            "will pick a data-loader worker or a rank next. Check data-loader workers, pinned "
            "memory and page cache from checkpoint reads.",
            for_=memory["for"],
        ),
        Alert(
            "NodeDown",
            with_node(f"up{{{node}}} == 0"),
            "critical", "node",
            "Node {{ $labels.node }} is down",
            "Prometheus cannot reach node_exporter on {{ $labels.node }} "
            f"({{{{ $labels.instance }}}}) for {p.alert('NodeDown')['for']}: the host is down, "
            "hung or cut off the network. Every rank on it is lost; GPU and exporter alerts for "
            "this node are silenced while this one fires.",
            for_=p.alert("NodeDown")["for"],
        ),
    ]
    return alert_groups("node", alerts, p.alert_interval, p.alert_group_suffix)
