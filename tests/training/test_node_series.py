"""What the training exporter serves so that the alert rules read one series per job and node
instead of one per rank (issue 14): the job's newest step and heartbeat on this node, the
hang-locating evidence only while the job's ranks here have stopped stepping, and the
non-finite loss counter only from the first one. The collector runs on a Store with a clock
of the test's (no network)."""

from __future__ import annotations

from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract.wire import RankReport
from trainwatch.exporters.node.training.collector import (
    STALL_EVIDENCE_MIN_IDLE_SECONDS,
    STALL_EVIDENCE_STEP_FACTOR,
    TrainingCollector,
)
from trainwatch.exporters.node.training.store import Store

JOB = "llm"


class Wall:
    """The Store's wall clock, moved by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _report(rank: int, step: int | None, wall: float | None, *, duration: float = 0.5,
            seq: int | None = None, nonfinite: int = 0, key: int = 0,
            exiting: bool = False, incarnation: str = "") -> RankReport:
    steps = [] if step is None else [(step, wall, duration, 1.0, 0.1, 1.0, 0.0)]
    return RankReport(job=JOB, rank=rank, local_rank=rank, world_size=4, restarts=0,
                      counters={catalog.TRAINING_NONFINITE_LOSS: nonfinite},
                      applied_counts={}, command_types={}, cuda=None,
                      collective_seq=seq, steps=steps, collective_key=key, exiting=exiting,
                      incarnation=incarnation)


def _scrape(store: Store) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in TrainingCollector(store, "n1").collect():
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _store(wall: Wall) -> Store:
    return Store(600, wall=wall)


def test_one_series_per_job_and_node_holds_the_newest_step_and_heartbeat() -> None:
    wall = Wall(1000.0)
    store = _store(wall)
    store.ingest(_report(0, 10, 990.0))
    wall.now = 1001.0
    store.ingest(_report(1, 10, 995.0))
    wall.now = 1002.0
    store.ingest(_report(2, None, None))  # alive, has not finished a step yet
    node = ((catalog.LABEL_NODE, "n1"), (catalog.LABEL_JOB, JOB))
    node = tuple(sorted(node))
    scrape = _scrape(store)
    assert scrape[catalog.TRAINING_NODE_LAST_STEP_TIMESTAMP] == {node: 995.0}
    assert scrape[catalog.TRAINING_NODE_HEARTBEAT_TIMESTAMP] == {node: 1002.0}
    # every rank's own series are still there, for dashboards and the flat rules
    assert len(scrape[catalog.TRAINING_HEARTBEAT_TIMESTAMP]) == 3


def test_stall_evidence_appears_only_once_the_ranks_here_stop_stepping() -> None:
    wall = Wall(1000.0)
    store = _store(wall)
    for rank, seq, key in ((0, 21, 7001), (1, 20, 0)):
        store.ingest(_report(rank, 20, 1000.0, seq=seq, key=key, exiting=rank == 1))
    after = max(STALL_EVIDENCE_MIN_IDLE_SECONDS, STALL_EVIDENCE_STEP_FACTOR * 0.5)
    wall.now = 1000.0 + after - 0.1
    assert catalog.TRAINING_STALL_EVIDENCE not in _scrape(store)  # a job at its own pace
    wall.now = 1000.0 + after + 0.1
    evidence = _scrape(store)[catalog.TRAINING_STALL_EVIDENCE]
    got = {(dict(k)["rank"], dict(k)["signal"]): v for k, v in evidence.items()}
    assert got == {("0", "seq"): 21.0, ("0", "step"): 20.0, ("0", "heartbeat"): 1000.0,
                   ("0", "collective"): 7001.0, ("0", "exited"): 0.0,
                   ("1", "seq"): 20.0, ("1", "step"): 20.0, ("1", "heartbeat"): 1000.0,
                   ("1", "collective"): 0.0, ("1", "exited"): 1.0}
    # per rank too (the rules without aggregation): the collective id, and the exit only once
    scrape = _scrape(store)
    assert {dict(k)["rank"]: v for k, v in scrape[catalog.TRAINING_COLLECTIVE_ID].items()} \
        == {"0": 7001.0, "1": 0.0}
    assert {dict(k)["rank"]: v for k, v in scrape[catalog.TRAINING_EXITED].items()} == {"1": 1.0}
    assert {dict(k)["node"] for k in evidence} == {"n1"}
    # one rank steps again: the job's ranks here progress, the evidence goes
    store.ingest(_report(0, 21, wall.now, seq=22))
    assert catalog.TRAINING_STALL_EVIDENCE not in _scrape(store)


def test_stall_evidence_names_the_launch_its_ranks_belong_to() -> None:
    """The evidence carries the launch (incarnation) of the ranks this node holds, so the
    rules can leave out an earlier launch that an old node still serves after the job moved
    (docs/performance.md, Chaos soak, bug 2); a new launch here replaces it."""
    wall = Wall(1000.0)
    store = _store(wall)
    first, second = "a" * 32, "b" * 32
    store.ingest(_report(1, 20, 1000.0, seq=20, incarnation=first))
    wall.now = 1010.0

    def launches() -> dict[tuple[str, str], str]:
        evidence = _scrape(store)[catalog.TRAINING_STALL_EVIDENCE]
        return {(dict(k)["rank"], dict(k)["signal"]): dict(k)[catalog.LABEL_INCARNATION]
                for k in evidence}

    assert set(launches().values()) == {first}
    assert len(launches()) == len(catalog.STALL_EVIDENCE_SIGNALS)
    # the job is requeued and its next launch's rank on this node reports and steps, then
    # stops: its evidence names the new launch, and the earlier launch's rank is gone
    store.ingest(_report(0, 3, 1020.0, seq=3, incarnation=second))
    wall.now = 1030.0
    assert launches() == {("0", signal): second for signal in catalog.STALL_EVIDENCE_SIGNALS}


def test_slow_steps_wait_longer_for_evidence() -> None:
    """A job whose steps take 10 s goes 10 s without a step at every step: no evidence then."""
    wall = Wall(1000.0)
    store = _store(wall)
    store.ingest(_report(0, 5, 1000.0, duration=10.0))
    wall.now = 1000.0 + 10.0 * STALL_EVIDENCE_STEP_FACTOR - 1
    assert catalog.TRAINING_STALL_EVIDENCE not in _scrape(store)
    wall.now = 1000.0 + 10.0 * STALL_EVIDENCE_STEP_FACTOR + 1
    assert _scrape(store)[catalog.TRAINING_STALL_EVIDENCE]


def test_no_evidence_for_ranks_that_never_stepped() -> None:
    wall = Wall(1000.0)
    store = _store(wall)
    store.ingest(_report(0, None, None, seq=3))
    wall.now = 5000.0
    scrape = _scrape(store)
    assert catalog.TRAINING_STALL_EVIDENCE not in scrape
    assert catalog.TRAINING_NODE_LAST_STEP_TIMESTAMP not in scrape


def test_the_nonfinite_counter_appears_with_the_first_nonfinite_loss() -> None:
    wall = Wall(1000.0)
    store = _store(wall)
    store.ingest(_report(0, 1, 1000.0))
    assert catalog.TRAINING_NONFINITE_LOSS not in _scrape(store)
    store.ingest(_report(0, 2, 1001.0, nonfinite=1))
    assert list(_scrape(store)[catalog.TRAINING_NONFINITE_LOSS].values()) == [1.0]


def _counters(rank: int, samples: float, flops: float = 0.0, peak: float = 0.0,
              step: int = 1, duration: float = 0.5) -> RankReport:
    report = _report(rank, step, 1000.0, duration=duration)
    report.counters.update({catalog.TRAINING_SAMPLES: samples,
                            catalog.TRAINING_TOKENS: samples * 10,
                            catalog.TRAINING_MODEL_FLOPS: flops,
                            catalog.TRAINING_PEAK_FLOPS: peak})
    return report


def _node_value(scrape: dict, name: str, suffix: str = "") -> float:
    (value,) = [v for k, v in scrape[name + suffix].items() if dict(k).get("le") in
                (None, "+Inf")]
    return value


def test_node_counters_add_up_the_ranks_and_never_go_backwards() -> None:
    """A rank that restarts counts again from 0: its whole new count is an increase."""
    store = _store(Wall(1000.0))
    store.ingest(_counters(0, 100.0))
    store.ingest(_counters(1, 50.0))
    assert _node_value(_scrape(store), catalog.TRAINING_NODE_SAMPLES) == 150.0
    store.ingest(_counters(0, 130.0))
    store.ingest(_counters(1, 20.0))  # rank 1 restarted: 20 new samples, not -30
    scrape = _scrape(store)
    assert _node_value(scrape, catalog.TRAINING_NODE_SAMPLES) == 200.0
    assert _node_value(scrape, catalog.TRAINING_NODE_TOKENS) == 2000.0
    # every step of every rank here lands in the node's histogram once
    assert _node_value(scrape, catalog.TRAINING_NODE_STEP_DURATION, "_count") == 4.0
    assert _node_value(scrape, catalog.TRAINING_NODE_STEP_DURATION, "_sum") == 2.0
    # no rank reports FLOPs: no FLOPs series, as per rank
    assert catalog.TRAINING_NODE_MODEL_FLOPS not in scrape
    assert catalog.TRAINING_NODE_PEAK_FLOPS not in scrape


def test_node_peak_counts_only_ranks_with_flops_and_a_peak() -> None:
    """MFU's denominator, as the per-rank rule had it: a rank without a peak (CPU) or without
    FLOPs counts in neither side."""
    store = _store(Wall(1000.0))
    store.ingest(_counters(0, 8.0, flops=1e15, peak=9.89e14))
    store.ingest(_counters(1, 8.0, flops=3e15, peak=0.0))
    store.ingest(_counters(2, 8.0, flops=0.0, peak=9.89e14))
    scrape = _scrape(store)
    assert _node_value(scrape, catalog.TRAINING_NODE_MODEL_FLOPS) == 1e15
    assert _node_value(scrape, catalog.TRAINING_NODE_PEAK_FLOPS) == 9.89e14


def test_a_new_launch_keeps_the_node_counters_growing() -> None:
    store = _store(Wall(1000.0))
    store.ingest(_counters(0, 100.0))
    relaunch = _counters(0, 10.0)
    relaunch.incarnation = "second-launch"
    store.ingest(relaunch)
    assert _node_value(_scrape(store), catalog.TRAINING_NODE_SAMPLES) == 110.0


def test_the_exporter_counts_nonfinite_losses_a_client_did_not() -> None:
    """Another implementation of the wire format may send a NaN loss without counting it:
    the alert reads only the counter, so the exporter counts what it receives."""
    store = _store(Wall(1000.0))
    report = _report(0, 1, 1000.0)
    report.steps = [(1, 1000.0, 0.5, float("nan"), 0.1, 1.0, 0.0),
                    (2, 1000.5, 0.5, float("inf"), 0.1, 1.0, 0.0)]
    store.ingest(report)
    assert list(_scrape(store)[catalog.TRAINING_NONFINITE_LOSS].values()) == [2.0]
    # a client that counts (tensors resolved late, reports it could not ship) is not undercut
    store.ingest(_report(0, 3, 1001.0, nonfinite=5))
    assert list(_scrape(store)[catalog.TRAINING_NONFINITE_LOSS].values()) == [5.0]


def test_a_nonfinite_loss_or_grad_norm_leaves_its_gauge_absent_until_a_finite_one() -> None:
    """The chaos soak's blind spike: a NaN loss served as the gauge's value made the spike
    alert's baseline (`avg_over_time` over the window before) NaN, and a spike 16.5 s after
    the NaN, once healed by a rollback, was never alerted. The gauges the baselines average
    are absent while the newest value is NaN or Inf; the counter carries the event."""
    store = _store(Wall(1000.0))
    store.ingest(_report(0, 1, 1000.0))
    bad = _report(0, 2, 1000.5)
    bad.steps = [(2, 1000.5, 0.5, float("nan"), 0.1, float("inf"), 0.0)]
    store.ingest(bad)
    scrape = _scrape(store)
    for gauge in (catalog.TRAINING_LOSS, catalog.TRAINING_GRAD_NORM):
        assert not scrape.get(gauge), gauge
    assert list(scrape[catalog.TRAINING_NONFINITE_LOSS].values()) == [1.0]
    assert list(scrape[catalog.TRAINING_STEP].values()) == [2.0]  # the step is still served
    store.ingest(_report(0, 3, 1001.0, nonfinite=1))  # finite again (after a rollback)
    scrape = _scrape(store)
    assert list(scrape[catalog.TRAINING_LOSS].values()) == [1.0]
    assert list(scrape[catalog.TRAINING_GRAD_NORM].values()) == [1.0]
    assert list(scrape[catalog.TRAINING_NONFINITE_LOSS].values()) == [1.0]
