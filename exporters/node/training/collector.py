"""Prometheus view of the Store: a custom collector, so expired jobs simply stop appearing.

Besides every rank's series, it serves what the alert rules read every round in a form that
costs Prometheus little (each series read costs it about 10 us, so 8,192 ranks cost 80 ms per
read): per job and node, the newest step and heartbeat of the job's ranks here; and the
per-rank evidence that locates a hang only while the job's ranks here have stopped stepping
(see stall_evidence_after), labelled with the launch (incarnation) its ranks belong to: after a
job moved nodes, the old node serves the earlier launch until the job expires here, and the
rules leave it out by that label. The non-finite loss counter appears with the first one (counted
here too, so every non-finite loss comes with it and the alert reads only the counter); the loss
and gradient-norm gauges are absent while the newest value is NaN or infinite (catalog
`finite`: a NaN sample would blind the spike alerts' baselines for their whole window).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.contract import goodput as gp
from trainwatch.exporters.node.training.ledger import NEGATIVE
from trainwatch.exporters.node.training.store import (
    STEP_DURATION_BUCKETS,
    RankState,
    StepHistogram,
    Store,
)

if TYPE_CHECKING:
    from trainwatch.exporters.node.fast_alerts import FastAlerts


def _base(name: str) -> str:
    """CounterMetricFamily wants the name without `_total` (it appends it)."""
    return name[: -len("_total")] if name.endswith("_total") else name


_FAMILIES = {c.GAUGE: GaugeMetricFamily, c.COUNTER: CounterMetricFamily,
             c.HISTOGRAM: HistogramMetricFamily}
# Per-rank series without labels of their own, by type (their rows in
# exporters/contract/catalog.py).
_PER_RANK = [row for row in c.metrics_of("training") if row.labels == c.TRAINING_LABELS]
GAUGES = tuple(row.name for row in _PER_RANK if row.type == c.GAUGE)
COUNTERS = tuple(row.name for row in _PER_RANK if row.type == c.COUNTER)
FINITE_ONLY = frozenset(row.name for row in _PER_RANK if row.finite)


# Stall evidence appears once every rank of a job on this node has gone this long without a
# step: max(STALL_EVIDENCE_MIN_IDLE_SECONDS, STALL_EVIDENCE_STEP_FACTOR x the slowest newest
# step of those ranks). The stall rules need it only after max(step_time_factor x the job's
# median step time, floor_seconds) without a step; tests/rules/test_aggregation.py checks
# that every rule profile leaves it time to be scraped.
STALL_EVIDENCE_MIN_IDLE_SECONDS = 2.0
STALL_EVIDENCE_STEP_FACTOR = 3.0


def stall_evidence_after(ranks: Mapping[int, RankState]) -> float:
    """Seconds without a step after which a job's ranks on this node expose stall evidence:
    long enough that a job stepping at its own pace never does, short enough that it is there
    before the rules can call the job stalled."""
    slowest = max((s.last_duration for s in ranks.values() if s.last_duration is not None),
                  default=0.0)
    return max(STALL_EVIDENCE_MIN_IDLE_SECONDS, STALL_EVIDENCE_STEP_FACTOR * slowest)


def _newest(values: Iterator[float | None]) -> float | None:
    return max((v for v in values if v), default=None)


def _add_histogram(family: Metric, labels: list[str], durations: StepHistogram) -> None:
    """One rank's or one node's step times; the store already counts cumulatively, which is
    what the exposition wants, so only the +Inf bucket (the count) is added here."""
    buckets = [(repr(bound), float(count)) for bound, count
               in zip(STEP_DURATION_BUCKETS, durations.bucket_counts, strict=True)]
    buckets.append(("+Inf", float(durations.duration_count)))
    family.add_metric(labels, buckets, durations.duration_sum)  # type: ignore[attr-defined]


def _family(name: str) -> Metric:
    """An empty family named, typed, documented and labelled as its table row says."""
    row = c.METRICS[name]
    return _FAMILIES[row.type](_base(name), row.help, labels=list(row.labels))


def _goodput_families(store: Store, jobs: Mapping[str, object], node: str) -> Iterator[Metric]:
    """The goodput counters of every job the ledger keeps on this node (one series per job,
    node and kind: they last through the gaps between a job's incarnations), and the live
    jobs' per-rank causes."""
    wall = _family(c.TRAINING_NODE_WALL)
    kinds = _family(c.TRAINING_NODE_TIME)
    discarded = _family(c.TRAINING_NODE_DISCARDED)
    negative = _family(c.TRAINING_NODE_NEGATIVE_INTERVALS)
    ledger = store.goodput
    ledger.settle()  # incarnations that ended for good: their last interval, once
    ledger.flush()  # what is served now survives an exporter restart
    for job, totals in ledger.totals(ledger.jobs()).items():
        wall.add_metric([job, node], totals["wall"])
        for kind in gp.KINDS:
            kinds.add_metric([job, node, kind], totals[kind])
        for cause in gp.DISCARD_CAUSES:
            discarded.add_metric([job, node, cause], totals[f"discarded_{cause}"])
        negative.add_metric([job, node], totals[NEGATIVE])
    per_rank = _family(c.TRAINING_RANK_BADPUT)
    for job, ranks in store.goodput.rank_seconds(jobs).items():
        for rank, seconds in sorted(ranks.items()):
            for kind, value in seconds.items():
                per_rank.add_metric([job, str(rank), node, kind], value)
    yield wall
    yield kinds
    yield discarded
    yield negative
    yield per_rank


class TrainingCollector(Collector):
    """Yields one fresh set of families per scrape from a snapshot of the store."""

    def __init__(self, store: Store, node: str, fast_alerts: FastAlerts | None = None) -> None:
        self._store = store
        self._node = node
        self._fast_alerts = fast_alerts

    def collect(self) -> Iterator[Metric]:
        g = {name: _family(name) for name in GAUGES}
        counters = {name: _family(name) for name in COUNTERS}
        wired = {**g, **counters}
        applied = _family(c.TRAINING_COMMANDS_APPLIED)
        histogram = _family(c.TRAINING_STEP_DURATION)
        node_last_step = _family(c.TRAINING_NODE_LAST_STEP_TIMESTAMP)
        node_heartbeat = _family(c.TRAINING_NODE_HEARTBEAT_TIMESTAMP)
        evidence = _family(c.TRAINING_STALL_EVIDENCE)
        node_samples = _family(c.TRAINING_NODE_SAMPLES)
        node_tokens = _family(c.TRAINING_NODE_TOKENS)
        node_flops = _family(c.TRAINING_NODE_MODEL_FLOPS)
        node_peak = _family(c.TRAINING_NODE_PEAK_FLOPS)
        node_histogram = _family(c.TRAINING_NODE_STEP_DURATION)
        compute_median = _family(c.TRAINING_NODE_COMPUTE_MEDIAN)
        compute_slowest = _family(c.TRAINING_NODE_COMPUTE_SLOWEST)
        compute_ranks = _family(c.TRAINING_NODE_COMPUTE_RANKS)
        launches = self._store.snapshot_with_launches()
        jobs = {job: (ranks, rollup) for job, (ranks, rollup, _) in launches.items()}
        now = self._store.wall()
        for job, (ranks, rollup, incarnation) in launches.items():
            node_values = [job, self._node]
            node_samples.add_metric(node_values, rollup.samples)
            node_tokens.add_metric(node_values, rollup.tokens)
            if rollup.model_flops:  # as per rank: a job without FLOPs has no FLOPs series
                node_flops.add_metric(node_values, rollup.model_flops)
                node_peak.add_metric(node_values, sum(
                    s.counters.get(c.TRAINING_PEAK_FLOPS, 0.0) for s in ranks.values()
                    if s.counters.get(c.TRAINING_MODEL_FLOPS)))
            _add_histogram(node_histogram, node_values, rollup.durations)
            last_step = _newest(s.last_step_time for s in ranks.values())
            if last_step is not None:
                node_last_step.add_metric(node_values, last_step)
            beat = _newest(s.heartbeat for s in ranks.values())
            if beat is not None:
                node_heartbeat.add_metric(node_values, beat)
            compute = {rank: m for rank, s in ranks.items()
                       if (m := s.compute_mean()) is not None}
            if compute:  # TrainingStragglerRank's inputs: the median here, the slowest here
                slowest = max(compute, key=lambda r: (compute[r], -r))
                compute_median.add_metric(node_values, statistics.median(compute.values()))
                compute_slowest.add_metric([*node_values, str(slowest)], compute[slowest])
                compute_ranks.add_metric(node_values, float(len(compute)))
            # A job none of whose ranks here stepped yet is not one the rules call stalled.
            idle = last_step is not None and now - last_step >= stall_evidence_after(ranks)
            for rank, s in ranks.items():
                values = [job, str(rank), self._node]
                collective = None if s.collective_seq is None else s.collective_key
                gauges = {
                    c.TRAINING_STEP: s.step, c.TRAINING_LOSS: s.loss,
                    c.TRAINING_LEARNING_RATE: s.lr, c.TRAINING_GRAD_NORM: s.grad_norm,
                    c.TRAINING_LAST_STEP_TIMESTAMP: s.last_step_time,
                    c.TRAINING_WORLD_SIZE: s.world_size, c.TRAINING_RESTARTS: s.restarts,
                    c.TRAINING_DATA_WAIT: s.data_wait,
                    c.TRAINING_CUDA_MEM_ALLOCATED: s.cuda[0] if s.cuda else None,
                    c.TRAINING_CUDA_MEM_RESERVED: s.cuda[1] if s.cuda else None,
                    c.TRAINING_HEARTBEAT_TIMESTAMP: s.heartbeat or None,
                    c.TRAINING_FINISHED: float(s.finished),
                    c.TRAINING_EXITED: 1.0 if s.exited else None,  # sparse: absent until then
                    c.TRAINING_IN_COLLECTIVE: (None if s.collective_seq is None
                                               else float(s.collective_since is not None)),
                    c.TRAINING_COLLECTIVE_START: s.collective_since,
                    c.TRAINING_COLLECTIVE_SEQ: s.collective_seq,
                    c.TRAINING_COLLECTIVE_ID: collective,
                    c.TRAINING_COMPUTE: compute.get(rank),
                }
                for name, value in gauges.items():
                    # never reported -> absent, not 0; a NaN/Inf loss or gradient norm ->
                    # absent too
                    if value is not None and (name not in FINITE_ONLY or math.isfinite(value)):
                        g[name].add_metric(values, float(value))
                if idle:
                    for signal, value in zip(c.STALL_EVIDENCE_SIGNALS,
                                             (s.collective_seq, s.step, s.heartbeat or None,
                                              collective, float(s.exited)),
                                             strict=True):
                        if value is not None:
                            evidence.add_metric([*values, signal, incarnation],
                                                float(value))
                # The datagram's numbers, each under its row; a sparse row (FLOPs and peak of
                # a job that reports none, non-finite losses before the first) is absent at 0.
                for row in c.RANK_WIRE:
                    value = s.counters.get(row.name, 0)
                    if value or not row.sparse:
                        wired[row.name].add_metric(values, float(value))
                for command, count in sorted(s.applied_counts.items()):
                    applied.add_metric([*values, command], float(count))
                _add_histogram(histogram, values, s.durations)
        yield from g.values()
        yield from counters.values()
        yield applied
        yield histogram
        yield node_last_step
        yield node_heartbeat
        yield evidence
        yield node_samples
        yield node_tokens
        yield node_flops
        yield node_peak
        yield node_histogram
        yield compute_median
        yield compute_slowest
        yield compute_ranks
        yield from _goodput_families(self._store, jobs, self._node)
        self_jobs = _family(c.TRAINING_EXPORTER_JOBS)
        self_jobs.add_metric([], float(len(jobs)))
        yield self_jobs
        datagrams = _family(c.TRAINING_EXPORTER_DATAGRAMS)
        datagrams.add_metric([], float(self._store.datagrams))
        yield datagrams
        malformed = _family(c.TRAINING_EXPORTER_MALFORMED)
        malformed.add_metric([], float(self._store.malformed))
        yield malformed
        if self._fast_alerts is not None:  # absent while fast alerts are off
            fast = _family(c.TRAINING_EXPORTER_FAST_ALERTS)
            for outcome, count in self._fast_alerts.outcomes():
                fast.add_metric([outcome], float(count))
            yield fast
        refused = _family(c.TRAINING_EXPORTER_REFUSED)
        for channel, count in self._store.refused.items():
            refused.add_metric([channel], float(count))
        yield refused
