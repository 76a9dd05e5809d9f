"""The demo installs what the demo needs and nothing else: scripts/setup.sh (what
scripts/demo.sh runs) lists no Slurm, PostgreSQL, podman, npm, ruby or VictoriaMetrics; those
are installed by `scripts/setup.sh --tests` (what scripts/test.sh runs). Neither blocks service
starts host-wide.

Before: one package list for both, the demo installed all of it, and /usr/sbin/policy-rc.d
was written for the length of the install.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "scripts" / "setup.sh"
TEST_ONLY = {"slurmctld", "slurmd", "slurm-client", "munge", "postgresql", "podman", "runc",
             "docker-compose", "npm", "ruby", "victoria-metrics"}


def packages(*flags: str) -> set[str]:
    done = subprocess.run(["bash", str(SETUP), "--list", *flags], capture_output=True,
                          text=True, timeout=60, check=True)
    return set(done.stdout.split())


def test_the_demo_installs_none_of_the_test_only_packages() -> None:
    demo = packages()
    assert demo == {"prometheus", "prometheus-alertmanager", "prometheus-node-exporter",
                    "supervisor", "python3-venv"}
    assert packages("--tests") == demo | TEST_ONLY
    assert "bash scripts/setup.sh\n" in (REPO / "scripts" / "demo.sh").read_text()
    assert "bash scripts/setup.sh --tests" in (REPO / "scripts" / "test.sh").read_text()
    for script in (REPO / "scripts").glob("*.sh"):
        assert "policy-rc.d" not in script.read_text(), script
