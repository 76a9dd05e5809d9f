"""MFU: model FLOPs (stated or 6N), the peak table, and a real CPU job whose achieved FLOP/s
the training exporter publishes (training_model_flops_total; rate() is what Prometheus's
recording rule computes). The MFU rule itself: alert_rules/tests/production/mfu_test.yml."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import requests
import torch
from prometheus_client.parser import text_string_to_metric_families

from tests.support.net import wait_until
from tests.training.support import exporter
from trainwatch.exporters.contract import catalog
from trainwatch.exporters.contract.launcher import RankInfo
from trainwatch.exporters.rank.client import TrainingMonitor
from trainwatch.exporters.rank.flops import ModelFlops, count_parameters, dtype_name, peak_flops


def test_six_n_per_token_and_per_sequence() -> None:
    flops = ModelFlops.from_parameters(1_000_000, seq_len=512)
    assert flops.per_token == 6e6
    assert flops.per_sample == 6e6 * 512
    assert flops.of(samples=4, tokens=2048) == 6e6 * 2048  # tokens win when both are known
    assert flops.of(samples=4, tokens=None) == 6e6 * 512 * 4
    # PaLM appendix B: 6N + 12 * L * d_model * T per token
    with_attention = ModelFlops.from_parameters(1_000_000, seq_len=512, attention=(2, 64))
    assert with_attention.per_token == 6e6 + 12 * 2 * 64 * 512


@pytest.mark.parametrize(("device", "dtype", "expected"), [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5e12),   # SXM: the fixture's GPU
    ("NVIDIA H100 80GB HBM3", torch.float8_e4m3fn, 1979e12),
    ("NVIDIA H100 PCIe", torch.bfloat16, 756e12),
    ("NVIDIA H100 NVL", "fp16", 835e12),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156e12),
    ("NVIDIA L4", "bf16", 121e12),
    ("NVIDIA L40S", "bf16", 362.05e12),
    ("NVIDIA A100-SXM4-80GB", "fp8", None),  # A100 has no FP8 tensor cores
    ("Some CPU", "fp32", None),
])
def test_peak_table(device: str, dtype: object, expected: float | None) -> None:
    assert peak_flops(device, dtype) == expected


@pytest.mark.parametrize("bad", [{}, {"per_sample": -1.0}, {"per_token": float("nan")},
                                 {"per_token": True}])
def test_bad_flops_figures_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        ModelFlops(**bad)
    with pytest.raises(ValueError, match="dtype"):
        dtype_name("int4")


def test_cpu_job_achieved_flops_match_the_known_figure_within_5_percent(tmp_path: Path) -> None:
    """A real CPU job (a Linear model, 6N FLOPs per token, a paced step) runs on a thread; two
    scrapes of the exporter 5 s apart give the FLOP/s Prometheus's rate() would, which must
    match FLOPs per step / the job's own mean step time between the same two scrapes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n = count_parameters(model)
    assert n == 64 * 128 + 128 + 128 * 8 + 8
    seq_len, batch = 16, 4
    flops = ModelFlops.from_parameters(n, seq_len=seq_len)
    tokens_per_step = batch * seq_len
    stop = threading.Event()
    steps = [0]

    def train(monitor: TrainingMonitor) -> None:
        while not stop.is_set():
            x = torch.randn(tokens_per_step, 64)
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(0.03)  # a steady step time
            monitor.report(steps[0], loss=loss.item(), samples=batch, tokens=tokens_per_step)
            steps[0] += 1

    with exporter(tmp_path) as exp:
        monitor = TrainingMonitor(
            socket_path=str(exp.socket), control=False, flush_interval=0.05,
            rank_info=RankInfo("mfu-cpu", rank=0, local_rank=0, world_size=1, restarts=0))
        monitor.set_model_flops(flops, peak_flops=2e9)
        thread = threading.Thread(target=train, args=(monitor,))
        thread.start()
        try:
            wait_until(lambda: exp.by_rank(catalog.TRAINING_MODEL_FLOPS, "mfu-cpu"),
                       timeout=20, what="first FLOPs")
            t1, f1, s1, c1 = _scrape(exp)
            time.sleep(5.0)  # the rate window
            t2, f2, s2, c2 = _scrape(exp)
        finally:
            stop.set()
            thread.join(10)
            monitor.close()
        achieved = (f2 - f1) / (t2 - t1)
        expected = flops.per_token * tokens_per_step / ((s2 - s1) / (c2 - c1))
        assert achieved == pytest.approx(expected, rel=0.05)
        wait_until(lambda: exp.by_rank(catalog.TRAINING_TOKENS, "mfu-cpu").get("0") == (
            steps[0] * tokens_per_step), timeout=10, what="last report")
        total = exp.by_rank(catalog.TRAINING_MODEL_FLOPS, "mfu-cpu")["0"]
        assert total == 6 * n * steps[0] * tokens_per_step
        assert exp.by_rank(catalog.TRAINING_PEAK_FLOPS, "mfu-cpu")["0"] == 2e9


def _scrape(exp) -> tuple[float, float, float, float]:
    """(time, flops_total, step-duration sum, step-duration count) of rank 0, from ONE scrape
    (as Prometheus takes them), stamped halfway through the request."""
    before = time.monotonic()
    body = requests.get(exp.url + "/metrics", timeout=5).text
    now = (before + time.monotonic()) / 2
    wanted = {catalog.TRAINING_MODEL_FLOPS: 0.0, catalog.TRAINING_STEP_DURATION + "_sum": 0.0,
              catalog.TRAINING_STEP_DURATION + "_count": 0.0}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name in wanted and sample.labels.get("training_job") == "mfu-cpu":
                wanted[sample.name] = sample.value
    flops, total, count = wanted.values()
    return now, flops, total, count


def test_a_job_without_flops_has_no_flops_series(tmp_path: Path) -> None:
    with exporter(tmp_path) as exp:
        monitor = TrainingMonitor(
            socket_path=str(exp.socket), control=False, flush_interval=0.05,
            rank_info=RankInfo("no-flops", rank=0, local_rank=0, world_size=1, restarts=0))
        try:
            monitor.report(0, loss=1.0, samples=4)
            wait_until(lambda: exp.by_rank(catalog.TRAINING_SAMPLES, "no-flops"), timeout=10,
                       what="report")
        finally:
            monitor.close()
        assert exp.by_rank(catalog.TRAINING_MODEL_FLOPS, "no-flops") == {}
        assert exp.by_rank(catalog.TRAINING_PEAK_FLOPS, "no-flops") == {}
