"""Issue 26, acceptance 1: a GPU alert computed from dcgm-exporter's series is one the
power-limit playbook acts on.

The alert's labels are those promtool proves the dcgm rules produce from dcgm-exporter's real
label set (alert_rules/tests/dcgm/gpu_test.yml, case "Hostname names the node": the scrape
address is an IP, so `node` can only come from dcgm-exporter's `Hostname`). The shipped
gpu_power_limit playbook must accept it at intake and its host check must resolve the node to
the one inventory host. The labels the mapping produced before the fix (no `node`, as it read
a `hostname` dcgm-exporter never writes on GPU series) are refused, fail closed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.remediation.helpers import REPO, alert, auth, payload
from trainwatch.remediation.actions.registry import check_targets
from trainwatch.remediation.labels import safe_labels
from trainwatch.remediation.playbooks import load_playbooks

CASES = REPO / "alert_rules" / "tests" / "dcgm" / "gpu_test.yml"
CASE = "dcgm-exporter's Hostname names the node when the scrape address is an IP"


def dcgm_alert_labels() -> dict[str, str]:
    """GpuTemperatureHigh's labels as the promtool case expects them for the GPU whose scrape
    address is an IP and whose node comes from dcgm-exporter's Hostname."""
    (case,) = [c for c in yaml.safe_load(CASES.read_text())["tests"] if c["name"] == CASE]
    fed = case["input_series"][0]["series"]
    assert "Hostname=" in fed and "node=" not in fed, fed  # node can only come from Hostname
    instance = fed.split('instance="', 1)[1].split('"', 1)[0]
    for check in case["alert_rule_test"]:
        for exp in check.get("exp_alerts") or []:
            labels: dict[str, Any] = exp["exp_labels"]
            if check["alertname"] == "GpuTemperatureHigh" and labels["instance"] == instance:
                return {"alertname": "GpuTemperatureHigh", **labels}
    raise AssertionError(f"no GpuTemperatureHigh for {instance} in {CASES}")


def write_inventory(path: Path, host: str) -> Path:
    path.write_text(yaml.safe_dump({"all": {"hosts": {host: {"ansible_connection": "local"}}}}))
    return path


def test_power_limit_playbook_accepts_the_dcgm_sourced_alert(service_factory,
                                                             tmp_path: Path) -> None:
    labels = dcgm_alert_labels()
    node = labels["node"]
    inventory = write_inventory(tmp_path / "inventory.yml", node)
    with service_factory(start_worker=False, playbooks_dir=str(REPO / "remediation" / "playbooks"),
                         ansible_inventory=str(inventory)) as svc:
        body = payload(alert("GpuTemperatureHigh", labels))
        resp = svc.client.post("/v1/alerts", json=body, headers=auth())
        assert resp.status_code == 200
        assert (resp.json["accepted"], resp.json["refused"]) == (1, 0), resp.json
        (intent,) = svc.store.list_intents()
        assert intent["playbook"] == "gpu_power_limit"
        assert intent["target_key"] == f"node={node},gpu={labels['gpu']}"
        # the engine's host check before anything is granted: exactly one inventory host
        book = load_playbooks(svc.config.playbooks_dir)["gpu_power_limit"]
        check_targets([*book.steps, *book.on_resolve],
                      safe_labels(labels, sorted(book.used_labels)), svc.config)


def test_the_alert_without_node_is_refused(service_factory) -> None:
    """What the mapping produced before the fix: the playbook refuses it (fail closed)."""
    labels = {k: v for k, v in dcgm_alert_labels().items() if k != "node"}
    with service_factory(start_worker=False,
                         playbooks_dir=str(REPO / "remediation" / "playbooks")) as svc:
        resp = svc.client.post("/v1/alerts", json=payload(alert("GpuTemperatureHigh", labels)),
                               headers=auth())
        assert resp.status_code == 200 and resp.json["refused"] == 1
        (refusal,) = svc.audit("refused")
        assert "missing target label 'node'" in refusal["reason"]
