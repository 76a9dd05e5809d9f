"""Every alert links to a runbook section that exists and says what to do."""

from __future__ import annotations

import re

import pytest

from tests.rules.rulefiles import PROFILES, ROOT, alerts

RUNBOOKS = ROOT / "docs" / "runbooks.md"
PARTS = ("**Meaning.**", "**Impact.**", "**Diagnosis.**", "**Remediation.**")


def _slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _sections() -> dict[str, str]:
    """Anchor -> text of each heading's section."""
    sections: dict[str, str] = {}
    current = None
    for line in RUNBOOKS.read_text().splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            current = _slug(match[1])
            sections[current] = ""
        elif current:
            sections[current] += line + "\n"
    return sections


@pytest.mark.parametrize("profile", PROFILES)
def test_every_runbook_url_points_at_an_existing_section(profile: str) -> None:
    sections = _sections()
    for name, rule in alerts(profile).items():
        url = rule["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        assert path.endswith("docs/runbooks.md"), url
        assert anchor in sections, f"{name}: no section #{anchor} in docs/runbooks.md"


def test_every_section_covers_meaning_impact_diagnosis_remediation() -> None:
    sections = _sections()
    for name in alerts("production"):
        text = sections[name.lower()]
        missing = [part for part in PARTS if part not in text]
        assert not missing, f"runbook section {name} lacks {missing}"


def test_slug_matches_github_rules() -> None:
    assert _slug("GpuTemperatureHigh") == "gputemperaturehigh"
    assert _slug("Node alerts") == "node-alerts"
