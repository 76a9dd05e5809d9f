"""Shared pytest configuration: the real binaries the suite relies on must be present."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

# One pytest process imports both Ansible (trainwatch.remediation.inventory parses inventories
# in-process)
# and PyTorch. ansible-core replaces `sys.intern` with a callable object on import, and
# torch._dynamo, imported lazily by torch.distributed.checkpoint, refuses to register its
# polyfill for anything but a real function. No Trainwatch process imports both (the
# remediation service has no torch, ranks have no Ansible); the suite does, so dynamo is
# imported first, while sys.intern is still the builtin.
with contextlib.suppress(ImportError):
    import torch._dynamo  # noqa: F401

REQUIRED_BINARIES = ("prometheus", "promtool", "prometheus-alertmanager", "amtool")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first, so the workers finish together (tests/support/order.py)."""
    from tests.support.order import longest_first

    longest_first(items)


@pytest.fixture(scope="session")
def real_binaries() -> dict[str, str]:
    """Paths of the Debian-packaged Prometheus tools; fail loudly (not skip) when missing,
    because CI installs them and a silent skip would hide a broken setup."""
    found = {name: shutil.which(name) for name in REQUIRED_BINARIES}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        pytest.fail(f"missing binaries {missing}: run scripts/setup.sh --tests")
    return {k: v for k, v in found.items() if v}


@pytest.fixture(scope="session")
def compose_rendered(tmp_path_factory: pytest.TempPathFactory,
                     real_binaries: dict[str, str]) -> Path:
    """compose/render.yml's output folder: the compose file (rendered from
    compose/docker-compose.yml.j2) beside the configs it mounts. Rendered once for every test
    that reads it (tests/compose, tests/field_checks): a render is an ansible-playbook run."""
    from tests.support.compose import GPU_NODES, render

    out = tmp_path_factory.mktemp("compose") / "rendered"
    proc = render(out, GPU_NODES)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr
    return out


@pytest.fixture(scope="session")
def ansible_collection() -> Path:
    """The trainwatch.stack collection built from ansible/ and installed into a temporary
    collections path, once per test process; every ansible-playbook run of the suite
    (tests/ansible/runner.py) uses it through ANSIBLE_COLLECTIONS_PATH."""
    from tests.ansible.runner import installed_collection

    return installed_collection()
