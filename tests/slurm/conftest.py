"""ONE Slurm test cluster for every test under tests/slurm: munged, slurmctld and three
`slurmd -N` nodes (tw-gpu-01..03; the third is the spare) under this session's tmp dir,
started once and stopped at the end. Each test gets it clean (no jobs, every node idle)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurm.cluster import SlurmCluster, missing_binaries, start


@pytest.fixture(scope="session")
def slurm_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    if missing:
        pytest.fail(f"missing Slurm binaries {missing}: run scripts/setup.sh --tests (installs "
                    "slurmctld, slurmd, slurm-client, munge)")
    cluster = start(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(slurm_session: SlurmCluster) -> Iterator[SlurmCluster]:
    slurm_session.reset_nodes()
    yield slurm_session
    slurm_session.reset_nodes()
