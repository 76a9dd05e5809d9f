"""The background loop and the XID thread, served over real HTTP (fake NVML: no GPU here)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from tests.gpu.helpers import (
    Series,
    make_loop,
    parse,
    render,
    started,
    static_fake,
    value,
    values,
)
from tests.support.net import free_port, wait_until
from trainwatch.exporters.contract import catalog as c
from trainwatch.exporters.node.gpu.collector_loop import CollectionLoop
from trainwatch.exporters.node.gpu.exposition import GpuCollector
from trainwatch.exporters.node.gpu.http_server import ExpositionApp, serve


@contextmanager
def served(loop: CollectionLoop) -> Iterator[str]:
    port = free_port()
    server, _ = serve(ExpositionApp(GpuCollector(loop, True)), "127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def collector_threads() -> int:
    """Threads that call NVML (HTTP request threads come and go and are not counted)."""
    return sum(t.name.startswith("gpu-") for t in threading.enumerate())


def scrape(url: str) -> Series:
    # The timeout is the behaviour under test: a scrape must never wait on NVML.
    response = requests.get(url, timeout=2)
    response.raise_for_status()
    return parse(response.text)


def test_hung_nvml_call_never_hangs_the_scrape_and_data_is_reported_stale() -> None:
    fake = static_fake(2)
    loop = make_loop(fake, interval=0.05, deadline=0.2)
    with started(loop), served(loop) as url:
        wait_until(lambda: value(scrape(url), c.GPU_EXPORTER_STALE) == 0 and loop.snapshot,
                   timeout=10,
                   what="first fresh snapshot")
        fake.update(lambda s: s["gpus"][1].update(hang=["nvmlDeviceGetPowerUsage"]))
        wait_until(lambda: value(scrape(url), c.GPU_EXPORTER_STALE) == 1, timeout=10,
                   what="stale flag")
        assert collector_threads() == 1
        series = scrape(url)
        # The last complete snapshot is still served, with its growing age.
        assert value(series, c.GPU_UP, gpu="1") == 1
        assert value(series, c.GPU_TEMPERATURE, gpu="0") > 0
        age = value(series, c.GPU_EXPORTER_DATA_AGE)
        wait_until(lambda: value(scrape(url), c.GPU_EXPORTER_DATA_AGE) > age + 0.2, timeout=10,
                   what="data age to grow")
        assert collector_threads() == 1, "NVML threads pile up while a call hangs"
        fake.update(lambda s: s["gpus"][1].update(hang=[]))
        wait_until(lambda: value(scrape(url), c.GPU_EXPORTER_STALE) == 0, timeout=10,
                   what="fresh again")
        series = scrape(url)
        assert value(series, c.GPU_EXPORTER_COLLECTIONS, result="overrun") >= 1
        assert value(series, c.GPU_POWER_USAGE, gpu="1") > 0


def test_xid_events_are_counted_per_gpu_and_code_including_repeats() -> None:
    fake = static_fake(2)
    loop = make_loop(fake, interval=0.05, watch_xid=True)
    with started(loop), served(loop) as url:
        wait_until(lambda: value(scrape(url), c.GPU_EXPORTER_XID_WATCH_UP) == 1, timeout=10,
                   what="XID watch running")
        for xid in (79, 79, 48):
            fake.inject_xid(1, xid)
        fake.update(lambda s: s.update(xid_events=[{"gpu": 0, "xid": 31}]))

        def counted() -> bool:
            series = scrape(url)
            return (values(series, c.GPU_XID_ERRORS, gpu="1", xid="79") == [2.0]
                    and values(series, c.GPU_XID_ERRORS, gpu="1", xid="48") == [1.0]
                    and values(series, c.GPU_XID_ERRORS, gpu="0", xid="31") == [1.0])

        wait_until(counted, timeout=10, what="XID counters")
        series = scrape(url)
        assert value(series, c.GPU_XID_ERRORS, gpu="1", xid="79",
                     uuid="GPU-5a1e0000-0000-4000-8000-000000000001") == 2


def test_xid_watch_reports_down_when_no_gpu_supports_events() -> None:
    fake = static_fake(1)
    fake.update(lambda s: s["gpus"][0].update(supports_events=False))
    loop = make_loop(fake, watch_xid=True)
    loop.run_once()
    watcher = loop.xid_watcher
    assert watcher is not None
    # The watcher ends by itself when no GPU registers: stopping it here would make the
    # assertion below true whatever the watcher did.
    wait_until(lambda: not watcher.is_alive(), timeout=10, what="XID watcher to give up")
    assert watcher.registered == 0 and not watcher.failed
    assert value(parse_loop(loop), c.GPU_EXPORTER_XID_WATCH_UP) == 0


def parse_loop(loop: CollectionLoop) -> Series:
    return parse(render(loop))


def test_real_process_is_attributed_to_job_and_rank_and_disappears_after_exit() -> None:
    """A real child process with a training environment; NVML (fake) lists its pid."""
    env = {"TRAINWATCH_JOB": "llama-pretrain", "RANK": "3", "TORCHELASTIC_RUN_ID": "none"}
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, env=env)
    try:
        # Attribution is cached per pid, so read only once the child's own environment is
        # visible in /proc (never the moment between fork and exec).
        environ = Path(f"/proc/{child.pid}/environ")
        wait_until(lambda: b"TRAINWATCH_JOB=llama-pretrain" in environ.read_bytes(),
                   timeout=10, what="the child's environment in /proc")
        fake = static_fake(1)
        fake.update(lambda s: s["gpus"][0].update(processes=[
            {"pid": child.pid, "used_memory": 5 * 2**30},
            {"pid": 999_999_999, "used_memory": 2**30},  # unreadable: unattributed
        ]))
        loop = make_loop(fake)
        loop.run_once()
        series = parse_loop(loop)
        assert value(series, c.GPU_PROCESS_MEMORY, gpu="0", training_job="llama-pretrain",
                     rank="3") == 5 * 2**30
        assert value(series, c.GPU_PROCESS_MEMORY, gpu="0", training_job="", rank="") == 2**30
        assert value(series, c.GPU_PROCESSES, gpu="0") == 2
    finally:
        child.communicate(b"", timeout=10)
    fake.update(lambda s: s["gpus"][0].update(processes=[]))
    loop.run_once()
    series = parse_loop(loop)
    assert values(series, c.GPU_PROCESS_MEMORY) == []
    assert value(series, c.GPU_PROCESSES, gpu="0") == 0
