"""compose/render.yml run as docs/deploy.md runs it: the compose file and the configs it mounts
are rendered by Ansible, so every test that reads the compose file renders first."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.ansible.runner import REPO, VENV_BIN, ansible_env

RENDER = REPO / "compose" / "render.yml"
GPU_NODES = "gpu-01.example.internal,gpu-02.example.internal"


def render(out: Path, gpu_nodes: str = "", **extra: object) -> subprocess.CompletedProcess[str]:
    """compose/render.yml into `out` (no inventory: the play adds its hosts)."""
    return subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", str(RENDER),
         "-e", json.dumps({"compose_out": str(out), "compose_gpu_nodes": gpu_nodes, **extra})],
        cwd=REPO, env=ansible_env(), capture_output=True, text=True, check=False, timeout=600)
