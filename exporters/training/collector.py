"""Prometheus view of the Store: a custom collector, so expired jobs simply stop appearing."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from exporters import catalog as c
from exporters.training.store import STEP_DURATION_BUCKETS, Store


def _base(name: str) -> str:
    """CounterMetricFamily wants the name without `_total` (it appends it)."""
    return name[: -len("_total")] if name.endswith("_total") else name


class TrainingCollector(Collector):
    """Yields one fresh set of families per scrape from a snapshot of the store."""

    def __init__(self, store: Store, node: str) -> None:
        self._store = store
        self._node = node

    def collect(self) -> Iterator[Metric]:
        labels = list(c.TRAINING_LABELS)
        g = {name: GaugeMetricFamily(name, doc, labels=labels) for name, doc in (
            (c.TRAINING_STEP, "Last step the rank reported."),
            (c.TRAINING_LOSS, "Loss at the last reported step (NaN/Inf exported as is)."),
            (c.TRAINING_LEARNING_RATE, "Learning rate at the last reported step."),
            (c.TRAINING_GRAD_NORM, "Gradient norm at the last reported step."),
            (c.TRAINING_LAST_STEP_TIMESTAMP, "Unix time of the last reported step."),
            (c.TRAINING_WORLD_SIZE, "World size the rank's launcher reported."),
            (c.TRAINING_RESTARTS, "Restart count the rank's launcher reported."),
            (c.TRAINING_DATA_WAIT, "Seconds the last step waited for data."),
            (c.TRAINING_CUDA_MEM_ALLOCATED, "CUDA memory allocated by the rank."),
            (c.TRAINING_CUDA_MEM_RESERVED, "CUDA memory reserved by the rank's allocator."),
            (c.TRAINING_PEAK_FLOPS, "Peak FLOP/s of the rank's GPU for its dtype (MFU's "
                                    "denominator)."),
            (c.TRAINING_HEARTBEAT_TIMESTAMP, "Unix time the rank's last datagram arrived."),
            (c.TRAINING_FINISHED, "1 once the rank closed its monitor (a clean end)."),
            (c.TRAINING_IN_COLLECTIVE, "1 while the rank is inside a collective."),
            (c.TRAINING_COLLECTIVE_START,
             "Unix time the rank entered the collective it is inside."),
            (c.TRAINING_COLLECTIVE_SEQ,
             "Sequence number of the last collective the rank entered on the job's group."),
        )}
        counters = {name: CounterMetricFamily(_base(name), doc, labels=labels) for name, doc in (
            (c.TRAINING_SAMPLES, "Samples processed."),
            (c.TRAINING_TOKENS, "Tokens processed."),
            (c.TRAINING_NONFINITE_LOSS, "Steps whose loss was NaN or infinite."),
            (c.TRAINING_DROPPED_SAMPLES, "Step reports the rank could not deliver."),
            (c.TRAINING_ROLLBACKS, "Checkpoint rollbacks the rank applied."),
            (c.TRAINING_MODEL_FLOPS, "Model FLOPs (forward + backward) of the samples or "
                                     "tokens processed; rate() = achieved FLOP/s."),
            (c.TRAINING_CHECKPOINT_FAILURES,
             "Checkpoint saves that failed on this rank (not eligible for rollback)."),
        )}
        applied = CounterMetricFamily(_base(c.TRAINING_COMMANDS_APPLIED),
                                      "Control commands the rank applied, by type.",
                                      labels=[*labels, "command"])
        histogram = HistogramMetricFamily(c.TRAINING_STEP_DURATION,
                                          "Wall time of one training step.", labels=labels)
        jobs = self._store.snapshot()
        for job, ranks in jobs.items():
            for rank, s in ranks.items():
                values = [job, str(rank), self._node]
                gauges = {
                    c.TRAINING_STEP: s.step, c.TRAINING_LOSS: s.loss,
                    c.TRAINING_LEARNING_RATE: s.lr, c.TRAINING_GRAD_NORM: s.grad_norm,
                    c.TRAINING_LAST_STEP_TIMESTAMP: s.last_step_time,
                    c.TRAINING_WORLD_SIZE: s.world_size, c.TRAINING_RESTARTS: s.restarts,
                    c.TRAINING_DATA_WAIT: s.data_wait,
                    c.TRAINING_CUDA_MEM_ALLOCATED: s.cuda[0] if s.cuda else None,
                    c.TRAINING_CUDA_MEM_RESERVED: s.cuda[1] if s.cuda else None,
                    c.TRAINING_PEAK_FLOPS: s.peak_flops or None,
                    c.TRAINING_HEARTBEAT_TIMESTAMP: s.heartbeat or None,
                    c.TRAINING_FINISHED: float(s.finished),
                    c.TRAINING_IN_COLLECTIVE: (None if s.collective_seq is None
                                               else float(s.collective_since is not None)),
                    c.TRAINING_COLLECTIVE_START: s.collective_since,
                    c.TRAINING_COLLECTIVE_SEQ: s.collective_seq,
                }
                for name, value in gauges.items():
                    if value is not None:  # never reported -> absent, not 0
                        g[name].add_metric(values, float(value))
                for name, value in ((c.TRAINING_SAMPLES, s.samples_total),
                                    (c.TRAINING_TOKENS, s.tokens_total),
                                    (c.TRAINING_NONFINITE_LOSS, s.nonfinite),
                                    (c.TRAINING_DROPPED_SAMPLES, s.dropped),
                                    (c.TRAINING_ROLLBACKS, s.rollbacks),
                                    (c.TRAINING_CHECKPOINT_FAILURES, s.checkpoint_failures)):
                    counters[name].add_metric(values, float(value))
                if s.flops_total:  # a job that does not report FLOPs has no FLOPs series
                    counters[c.TRAINING_MODEL_FLOPS].add_metric(values, s.flops_total)
                for command, count in sorted(s.applied_counts.items()):
                    applied.add_metric([*values, command], float(count))
                # The store counts cumulatively already (a duration lands in every bucket
                # whose bound it does not exceed), which is what the exposition wants.
                buckets = [(repr(bound), float(count)) for bound, count
                           in zip(STEP_DURATION_BUCKETS, s.bucket_counts, strict=True)]
                buckets.append(("+Inf", float(s.duration_count)))
                histogram.add_metric(values, buckets, s.duration_sum)
        yield from g.values()
        yield from counters.values()
        yield applied
        yield histogram
        self_jobs = GaugeMetricFamily(c.TRAINING_EXPORTER_PREFIX + "jobs",
                                      "Jobs currently reporting to this exporter.")
        self_jobs.add_metric([], float(len(jobs)))
        yield self_jobs
        datagrams = CounterMetricFamily(c.TRAINING_EXPORTER_PREFIX + "datagrams",
                                        "Datagrams received from ranks.")
        datagrams.add_metric([], float(self._store.datagrams))
        yield datagrams
        malformed = CounterMetricFamily(c.TRAINING_EXPORTER_PREFIX + "malformed_datagrams",
                                        "Datagrams ignored because they broke the protocol.")
        malformed.add_metric([], float(self._store.malformed))
        yield malformed
