"""Every XID fact the rules, the runbooks and the playbooks state agrees with the one table,
remediation/fault_classes.yaml: each XID's class, the class's automatic action and the severity
of its alert.

The GpuXidErrors rules and the runbook's XID table are generated from the table (the build
fails the suite while they are stale); these tests read what was generated and what people
wrote around it, so a hand edit, a stale file or prose that names an XID the table classes
otherwise fails here. What an alert does is checked by promtool, not by reading its text: for
every XID of the table (and one it does not list) a firing GpuXidErrors carries the class and
the severity the table gives it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from alert_rules.config import load_raw, resolve, seconds
from tests.rules.rulefiles import PROFILES, ROOT, rule_files, rules
from trainwatch.remediation.faults import FaultTable, load_table

TABLE: FaultTable = load_table()
UNLISTED_XID = 999  # an XID the table does not list: its `unknown_xid` class
RUNBOOKS = ROOT / "docs" / "runbooks.md"
PLAYBOOKS = ROOT / "remediation" / "playbooks"
# Where people write about XIDs (the promtool cases are left out: promtool checks them, and
# they name an unlisted XID on purpose).
PROSE = sorted({*ROOT.glob("alert_rules/*.py"), *ROOT.glob("alert_rules/*.yml"),
                *ROOT.glob("alert_rules/generated/**/*.y*ml"), *ROOT.glob("docs/*.md"),
                *PLAYBOOKS.glob("*.yaml")})

_NUMBERS = r"\d+(?:\s*(?:,|/|\band\b|\bor\b)\s*\d+)*"
# "XID 79", "XIDs 13/31/43", "XID 48/94/95", "XIDs (13, 31, 43, 45)", "XIDs 13, 31 and 45"
XID_MENTION = re.compile(rf"\bXIDs?\s+\(?({_NUMBERS})")
CLASSES = "|".join(TABLE.classes)
# "application XIDs (13, 31, 43, 45)", "hardware XID 79"
CLASS_BEFORE = re.compile(rf"\b({CLASSES})\s+XIDs?\s+\(?({_NUMBERS})", re.IGNORECASE)
# "XIDs 13/31/43 usually mean an application fault", "48, 63 and 79 mean hardware trouble";
# a number that ends a name ("while mon-01 is killed") is no XID
CLASS_AFTER = re.compile(
    rf"(?<![\w-])({_NUMBERS})\s+(?:\w+\s+)?(?:means?|are|is)\s+(?:an?\s+)?({CLASSES})\b",
    re.IGNORECASE)


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def _xid_rules(profile: str) -> list[dict]:
    return [r for r in rules(profile) if r.get("alert") == "GpuXidErrors"]


@pytest.mark.parametrize("profile", PROFILES)
def test_one_xid_rule_per_class_with_the_class_severity(profile: str) -> None:
    found = {}
    for rule in _xid_rules(profile):
        cls = rule["labels"].get("fault_class")
        assert cls in TABLE.classes, f"{profile}: a GpuXidErrors rule without a table class"
        assert rule["labels"]["severity"] == TABLE.classes[cls].severity, (profile, cls)
        found[cls] = rule
    assert sorted(found) == sorted(TABLE.xid_classes()), profile


@pytest.mark.parametrize("profile", ["production", "dcgm"])  # the two GPU sources
def test_every_xid_fires_with_its_class_and_severity(real_binaries: dict[str, str],
                                                    tmp_path: Path, profile: str) -> None:
    """One GPU per XID (its `gpu` label is the XID), each reporting it once; promtool
    evaluates the generated rules and the firing alerts' class and severity must be the
    table's. dcgm-exporter reports the last XID as a gauge value, Trainwatch counts per XID."""
    config = resolve(load_raw(), profile).alert("GpuXidErrors")
    interval = 15
    fired = 2 * interval + seconds(config["for"]) + interval
    assert fired < seconds(config["window"])
    series = []
    for xid in [*sorted(TABLE.xids), UNLISTED_XID]:
        if profile == "dcgm":
            series.append({
                "series": f'DCGM_FI_DEV_XID_ERRORS{{job="dcgm-exporter",instance="h1:9400",'
                          f'gpu="{xid}",UUID="GPU-{xid}",modelName="H100",Hostname="h1"}}',
                "values": f"0 0 {xid}x40"})
        else:
            series.append({
                "series": f'trainwatch_gpu_xid_errors_total{{job="gpu",instance="h1:9445",'
                          f'gpu="{xid}",uuid="GPU-{xid}",name="H100",xid="{xid}"}}',
                "values": "0 0 1x40"})
    expected = []
    for xid in [*sorted(TABLE.xids), UNLISTED_XID]:
        cls = TABLE.xid_class(xid)
        labels = f'{{fault_class="{cls}",gpu="{xid}",severity="{TABLE.classes[cls].severity}"}}'
        expected.append({"labels": labels, "value": 1})
    case = {
        "rule_files": [str(p) for p in rule_files(profile)],
        "evaluation_interval": f"{interval}s",
        "tests": [{
            "interval": f"{interval}s",
            "input_series": series,
            "promql_expr_test": [{
                "expr": 'count by (gpu, severity, fault_class) '
                        '(ALERTS{alertname="GpuXidErrors",alertstate="firing"})',
                "eval_time": f"{fired:g}s",
                "exp_samples": expected,
            }],
        }],
    }
    path = tmp_path / "xid_test.yml"
    path.write_text(yaml.safe_dump(case, sort_keys=False))
    result = subprocess.run([real_binaries["promtool"], "test", "rules", path.name],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("profile", PROFILES)
def test_every_signal_alert_has_its_class_severity(profile: str) -> None:
    by_name = {r["alert"]: r for r in rules(profile) if "alert" in r}
    for name, signal in TABLE.signals.items():
        if signal.fault_class == "by_xid":
            continue
        assert name in by_name, f"{profile}: the table's signal {name} is no alert"
        assert by_name[name]["labels"]["severity"] == \
            TABLE.classes[signal.fault_class].severity, (profile, name)


def _runbook_xid_rows() -> list[dict[str, str]]:
    """The rows of the table in the runbook's GpuXidErrors section, by column header."""
    text = RUNBOOKS.read_text()
    section = text[text.index("### GpuXidErrors"):]
    section = section[:section.index("\n### ", 1)]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")),
                     strict=True)) for line in lines[2:]]


def _column(row: dict[str, str], word: str) -> str:
    return next(value for key, value in row.items() if key.lower().startswith(word))


def test_the_runbook_xid_table_is_the_fault_table() -> None:
    rows = _runbook_xid_rows()
    assert any(key.lower().startswith("severity") for key in rows[0]), \
        "the runbook's XID table has no severity column"
    seen: set[int] = set()
    for row in rows:
        xids = _numbers(_column(row, "xid"))
        cls = _column(row, "class")
        for xid in xids or [UNLISTED_XID]:  # "any other": the unlisted XIDs' class
            fault = TABLE.classes[TABLE.xid_class(xid)]
            assert cls == f"{fault.name} ({fault.action})", (xid, row)
            assert _column(row, "severity") == fault.severity, (xid, row)
        seen.update(xids)
    assert seen == set(TABLE.xids), "the runbook's XID rows are not the table's XIDs"


def test_every_xid_named_in_rules_docs_and_playbooks_is_the_tables() -> None:
    unknown, wrong = [], []
    for path in PROSE:
        text = " ".join(path.read_text().split())  # a sentence wrapped over lines is one
        where = str(path.relative_to(ROOT))
        for match in XID_MENTION.finditer(text):
            unknown += [f"{where}: XID {x}" for x in _numbers(match[1]) if x not in TABLE.xids]
        claims = [(m[1], m[2]) for m in CLASS_BEFORE.finditer(text)]
        claims += [(m[2], m[1]) for m in CLASS_AFTER.finditer(text)]
        for cls, numbers in claims:
            wrong += [f"{where}: XID {x} called {cls.lower()}, the table says "
                      f"{TABLE.xid_class(x)}" for x in _numbers(numbers)
                      if TABLE.xid_class(x) != cls.lower()]
    assert unknown == [], "XIDs the fault table does not list"
    assert wrong == [], "XIDs given another class than the fault table's"


def test_the_prose_check_sees_a_wrong_class_and_an_unknown_xid() -> None:
    wrong = "XIDs 13/31/43 usually mean an application fault; 48, 63 and 79 mean hardware trouble"
    claims = [(m[2], m[1]) for m in CLASS_AFTER.finditer(wrong)]
    assert [(cls, _numbers(n)) for cls, n in claims] == [
        ("application", [13, 31, 43]), ("hardware", [48, 63, 79])]
    assert TABLE.xid_class(63) != "hardware"
    assert [_numbers(m[1]) for m in XID_MENTION.finditer("see XID 48/94/95, XIDs (13, 31)")] == [
        [48, 94, 95], [13, 31]]
    assert [(m[1], _numbers(m[2])) for m in CLASS_BEFORE.finditer(
        "Application XIDs (13, 31, 43, 45) drain nothing")] == [("Application", [13, 31, 43, 45])]


def test_playbook_xid_matchers_name_table_xids_of_an_acting_class() -> None:
    """A playbook that matches on the `xid` label names only XIDs of the table; one that
    quarantines names none whose class the table leaves to a person (action none)."""
    for path in sorted(PLAYBOOKS.glob("*.yaml")):
        book = yaml.safe_load(path.read_text())
        matcher = (book["match"].get("labels") or {}).get("xid")
        if not matcher:
            continue
        (kind, value), = matcher.items()
        xids = _numbers(value)
        assert kind in ("equals", "regex") and re.fullmatch(r"[\d|]+", value), \
            f"{path.name}: match xid by the table's numbers ({kind}: {value!r})"
        assert set(xids) <= set(TABLE.xids), path.name
        if any(step.get("action") == "quarantine" for step in book["steps"]):
            assert all(TABLE.classes[TABLE.xid_class(x)].action != "none" for x in xids), \
                path.name


def test_quarantine_playbooks_match_only_the_tables_signals() -> None:
    """The quarantine action classifies an alert by the table and refuses one it does not
    list: a playbook that quarantines on another alert would never act."""
    for path in sorted(PLAYBOOKS.glob("*.yaml")):
        book = yaml.safe_load(path.read_text())
        if any(step.get("action") == "quarantine" for step in book["steps"]):
            assert set(book["match"]["alertname"]) <= set(TABLE.signals), path.name
