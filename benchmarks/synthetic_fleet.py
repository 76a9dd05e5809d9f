"""A synthetic GPU training fleet's history, pushed into a real Prometheus's head block.

Nodes x 8 GPUs, one training job with one rank per GPU: node, GPU and training series named
and labelled as the exporters emit them for a healthy fleet (about 35 series per GPU + rank):
series the exporters expose only on an event (stall evidence, error counters before the
first error) are absent, as they are in production. Every series has
one sample every `step` seconds from `start` to `end`; values follow a few simple shapes
(constants, counters that grow with the step count, a slowly falling loss), so no alert
fires and every window the rules read is full.

The history goes in through Prometheus's remote-write receiver, in time bands of 30 minutes
(all series, then the next band), so every sample is appended in order to the head block, as
scraped samples are in production, where every window the rules read (one hour at most)
lies in the head. Backfilled blocks (`promtool tsdb create-blocks-from`) would put it in
on-disk blocks instead, which are read differently (index decoding, one iterator per block).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import requests

from benchmarks import remote_write
from trainwatch.exporters.contract.catalog import PORTS
from trainwatch.exporters.contract.goodput import DISCARD_CAUSES, KINDS

GPUS_PER_NODE = 8
BUCKETS = ("0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "+Inf")
# clock-event reasons are exposed only while active: power capping is, at full load
REASONS = ("sw_power_cap",)
# Samples older than the head's newest minus half a chunk range (1 h) are refused as out of
# bounds, so a band must be shorter than that.
BAND_SECONDS = 30 * 60
REQUEST_BYTES = 4 << 20


@dataclass(frozen=True)
class Series:
    name: str
    labels: dict[str, str]
    kind: str  # how its value moves, see value()


def _node(n: int) -> Iterator[Series]:
    host = f"node{n:04d}"
    node = {"job": "node", "instance": f"{host}:{PORTS['node_exporter']}"}
    gpu_inst = {"job": "gpu", "instance": f"{host}:{PORTS['gpu_exporter']}"}
    train_inst = {"job": "training", "instance": f"{host}:{PORTS['training_exporter']}"}
    for inst in (node, gpu_inst, train_inst):
        yield Series("up", inst, "one")
    fs = {**node, "device": "/dev/nvme0n1", "fstype": "ext4", "mountpoint": "/data"}
    yield Series("node_filesystem_avail_bytes", fs, "disk")
    yield Series("node_filesystem_size_bytes", fs, "1e12")
    yield Series("node_filesystem_readonly", fs, "zero")
    yield Series("node_memory_MemAvailable_bytes", node, "2e11")
    yield Series("node_memory_MemTotal_bytes", node, "5e11")
    yield Series("trainwatch_gpu_exporter_last_success_timestamp_seconds", gpu_inst, "ts")
    # the training exporter's per job and node series (its ranks step, so no stall evidence,
    # and no non-finite loss counter before the first non-finite loss)
    job_node = {**train_inst, "training_job": "llm", "node": host}
    yield Series("training_node_last_step_timestamp_seconds", job_node, "ts")
    yield Series("training_node_heartbeat_timestamp_seconds", job_node, "ts")
    # ... and the sums of its GPUS_PER_NODE ranks' counters (the per-rank kinds x 8)
    yield Series("training_node_samples_total", job_node, "steps64")
    yield Series("training_node_tokens_total", job_node, "steps65536")
    yield Series("training_node_model_flops_total", job_node, "flops8")
    yield Series("training_node_peak_flops_per_second", job_node, "7.912e15")
    yield from _step_histogram("training_node_step_duration_seconds", job_node, "steps8",
                               "steps16")
    # own compute time per step: the median and the slowest of its ranks, how many measured
    yield Series("training_node_compute_median_seconds", job_node, "1.5")
    yield Series("training_node_compute_slowest_seconds",
                 {**job_node, "rank": str(n * GPUS_PER_NODE)}, "1.55")
    yield Series("training_node_compute_ranks", job_node, str(GPUS_PER_NODE))
    # goodput (exporters/node/training/ledger.py): rank-seconds of its 8 ranks by kind, 7/8
    # productive and 1/8 data wait, nothing discarded
    yield Series("training_node_wall_seconds_total", job_node, "secs8")
    for kind in KINDS:
        yield Series("training_node_time_seconds_total", {**job_node, "kind": kind},
                     {"productive": "secs7", "data_wait": "secs1"}.get(kind, "zero"))
    for cause in DISCARD_CAUSES:
        yield Series("training_node_discarded_seconds_total", {**job_node, "cause": cause},
                     "zero")
    for g in range(GPUS_PER_NODE):
        gl = {**gpu_inst, "gpu": str(g), "uuid": f"GPU-{n}-{g}", "name": "H100"}
        yield Series("trainwatch_gpu_up", gl, "one")
        yield Series("trainwatch_gpu_temperature_celsius", gl, "temp")
        yield Series("trainwatch_gpu_utilization_ratio", gl, "0.9")
        yield Series("trainwatch_gpu_memory_used_bytes", gl, "6e10")
        yield Series("trainwatch_gpu_memory_total_bytes", gl, "8e10")
        for reason in REASONS:
            yield Series("trainwatch_gpu_clock_event_reason_active", {**gl, "reason": reason},
                         "one")
        rl = {**train_inst, "training_job": "llm", "rank": str(n * GPUS_PER_NODE + g),
              "node": host}
        for name, kind in (
                ("training_step", "steps"), ("training_loss", "loss"),
                ("training_grad_norm", "0.5"), ("training_last_step_timestamp_seconds", "ts"),
                ("training_heartbeat_timestamp_seconds", "ts"),
                ("training_collective_sequence", "steps"), ("training_finished", "zero"),
                ("training_collective_id", "zero"), ("training_compute_seconds", "1.5"),
                ("training_peak_flops_per_second", "9.89e14"),
                ("training_samples_total", "steps8"), ("training_tokens_total", "steps8192"),
                ("training_model_flops_total", "flops")):
            yield Series(name, rl, kind)
        yield from _step_histogram("training_step_duration_seconds", rl, "steps", "steps2")


def _step_histogram(name: str, labels: dict[str, str], count: str,
                    total: str) -> Iterator[Series]:
    """Steps of 2 s: every step in the buckets from 2.5 s up, `count` of them, `total` s."""
    for le in BUCKETS:
        yield Series(f"{name}_bucket", {**labels, "le": le},
                     count if le in ("2.5", "5.0", "+Inf") else "zero")
    yield Series(f"{name}_sum", labels, total)
    yield Series(f"{name}_count", labels, count)


def fleet(nodes: int) -> Iterator[Series]:
    for n in range(nodes):
        yield from _node(n)


def value(kind: str, ts: int, start: int) -> float:
    """The value of a series of `kind` at `ts` (s); one step every 2 s since `start`."""
    t = ts - start
    steps = t // 2
    match kind:
        case "one":
            return 1.0
        case "zero":
            return 0.0
        case "ts":
            return float(ts)
        case "steps":
            return float(steps)
        case "steps2":
            return steps * 2.0
        case "steps8":
            return steps * 8.0
        case "steps8192":
            return steps * 8192.0
        case "steps16":
            return steps * 16.0
        case "steps64":
            return steps * 64.0
        case "steps65536":
            return steps * 65536.0
        case "flops":
            return steps * 1e15
        case "flops8":
            return steps * 8e15
        case "loss":
            return 2.0 + 1.0 / (1 + steps / 100)
        case "temp":
            return float(60 + (t // 60) % 7)
        case "secs1" | "secs7" | "secs8":
            return t * float(kind[4:])
        case "disk":
            return 5e11 - t * 1e4
        case _:
            return float(kind)


def push(url: str, nodes: int, start: int, end: int, step: int) -> int:
    """Remote-write every series' samples in [start, end) into Prometheus at `url`; returns
    the number of series. Every series of one kind has the same samples, so each band's
    samples are encoded once per kind."""
    series = [(remote_write.labels({"__name__": s.name, **s.labels}), s.kind)
              for s in fleet(nodes)]
    session = requests.Session()

    def send(parts: list[bytes]) -> None:
        response = session.post(f"{url}/api/v1/write", data=remote_write.request(parts),
                                headers=remote_write.HEADERS, timeout=300)
        if response.status_code // 100 != 2:
            raise RuntimeError(f"remote write refused: {response.status_code} "
                               f"{response.text[:500]}")

    for band in range(start, end, BAND_SECONDS):
        stamps = range(band, min(band + BAND_SECONDS, end), step)
        encoded = {kind: b"".join(remote_write.sample(value(kind, ts, start), ts * 1000)
                                  for ts in stamps)
                   for kind in {k for _, k in series}}
        parts: list[bytes] = []
        size = 0
        for labels, kind in series:
            part = remote_write.timeseries(labels, encoded[kind])
            parts.append(part)
            size += len(part)
            if size >= REQUEST_BYTES:
                send(parts)
                parts, size = [], 0
        if parts:
            send(parts)
    return len(series)
