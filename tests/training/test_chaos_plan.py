"""The chaos soak's plan (benchmarks/chaos.py, issue 41 acceptance 3): it comes from the seed
alone, so a run can be repeated fault for fault; every kind comes once per round, so a run of at
least as many faults as kinds has each; nothing is planned past --minutes; and the command line
refuses a kind it does not know before it starts anything."""

from __future__ import annotations

import pytest

from benchmarks import chaos


def test_the_same_seed_gives_the_same_faults_at_the_same_moments() -> None:
    kinds = list(chaos.ALL_KINDS)
    first = chaos.plan(2384, 60, 180, kinds)
    assert first == chaos.plan(2384, 60, 180, kinds)
    assert first != chaos.plan(2385, 60, 180, kinds)


def test_every_kind_comes_once_per_round_and_none_past_the_end() -> None:
    kinds = list(chaos.ALL_KINDS)
    for seed in range(20):
        faults = chaos.plan(seed, 120, 120, kinds)
        moments = [at for at, _ in faults]
        assert moments == sorted(moments) and all(0 < at < 120 * 60 for at in moments)
        for start in range(0, len(faults) - len(kinds) + 1, len(kinds)):
            round_ = [kind for _, kind in faults[start:start + len(kinds)]]
            assert sorted(round_) == sorted(kinds), (seed, start)


def test_the_issue_kinds_are_all_in_the_default_mix() -> None:
    # issue 41's list: GPU faults, rank faults, the job's data and disk, the infrastructure
    assert set(chaos.ALL_KINDS) == {
        "xid", "gpu_lost", "ecc", "kill", "hang", "socket_cut", "nan", "spike", "log_disk",
        "replica", "training_exporter", "gpu_exporter", "slurmctld", "prometheus",
        "remediation"}


def test_an_unknown_kind_is_refused_before_anything_starts(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        chaos.main(["--kinds", "kill,meteor"])
    assert exit_.value.code == 2
    assert "meteor" in capsys.readouterr().err
