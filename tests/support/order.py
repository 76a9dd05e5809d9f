"""The order the suite's files are handed to the xdist workers: longest first.

`--dist loadfile` keeps each file on one worker and hands files out in order. xdist's own
order (`--loadscope-reorder`, most tests first) started the files with few, long tests last:
on 2026-12-07 the molecule scenario (one test, five minutes) started 24 minutes into a
31-minute run and most of the last seven minutes had one or two busy workers out of four.
Handing out the longest files first (the classic longest-processing-time rule) lets the
short ones fill the gaps instead. scripts/test.sh passes `--no-loadscope-reorder` so this
order is the one used.

LONGEST_FIRST is measured, not guessed: the files whose tests took longest (wall seconds,
`--durations`) in that run, longest first. A file missing here only starts later; one that
no longer exists is ignored.
"""

from __future__ import annotations

from collections import Counter

import pytest

LONGEST_FIRST = (
    "tests/cluster/test_loopback_cluster.py",
    "tests/training/test_checkpoint_multirank.py",
    "tests/slurm/test_heal_hang.py",
    "tests/field_checks/test_molecule.py",
    # the Slurm site deployed from the collection (issue 38; 2026-12-07: 127-150 s alone on
    # the quiet machine, 302-478 s beside another 3-worker run), which took over the deploy
    # tests of test_collection_alone.py and test_use_existing.py (123 and 118 s in the final
    # full run of that day)
    "tests/cluster/test_site_deploy.py",
    "tests/slurm/test_heal_pipeline.py",
    "tests/ansible/test_render.py",
    "tests/training/test_sharded_rollback.py",
    "tests/ansible/test_postgresql_role.py",
    "tests/ansible/test_handlers.py",
    "tests/packaging/test_fresh_install.py",
    "tests/ansible/test_victoriametrics_role.py",
    "tests/training/test_goodput_job.py",
    "tests/packaging/test_client_install.py",
    "tests/slurm/test_scheduler_faults.py",
    "tests/training/test_goodput_prometheus.py",
    "tests/compose/test_compose.py",
    "tests/e2e/test_loss_spike_remediation.py",
    "tests/training/test_straggler.py",
    "tests/ansible/test_local_deploy.py",
)


def file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def longest_first(items: list[pytest.Item]) -> None:
    """Reorder `items` in place: the LONGEST_FIRST files in that order, then every other
    file by its number of tests, most first (xdist's own rule). A file's tests keep their
    order and stay together (module fixtures rely on both)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    tests_in = Counter(file_of(item) for item in items)
    items.sort(key=lambda item: (rank.get(file_of(item), len(rank)),
                                 -tests_in[file_of(item)], file_of(item)))
