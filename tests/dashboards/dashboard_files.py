"""The generated dashboards as parsed JSON, shared by the dashboard tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS_DIR = ROOT / "dashboards"
GENERATED = DASHBOARDS_DIR / "generated"


def load_all() -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON."""
    return {p.name: json.loads(p.read_text()) for p in sorted(GENERATED.glob("*.json"))}
