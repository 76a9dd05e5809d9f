"""`gpu-exporter`: serve NVML GPU metrics over HTTP until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from trainwatch.exporters.node.fast_alerts import FastAlerts
from trainwatch.exporters.node.gpu.collector_loop import CollectionLoop
from trainwatch.exporters.node.gpu.config import (
    ConfigError,
    ScenarioError,
    Settings,
    build_parser,
    resolve,
)
from trainwatch.exporters.node.gpu.exposition import GpuCollector
from trainwatch.exporters.node.gpu.http_server import ExpositionApp, serve
from trainwatch.exporters.node.gpu.nvml_source import load_nvml
from trainwatch.exporters.node.gpu.processes import ProcessAttributor, read_proc_environ
from trainwatch.exporters.node.gpu.snapshot import GpuIdentity

log = logging.getLogger("gpu-exporter")


def fast_xid(settings: Settings) -> Callable[[GpuIdentity, int], None] | None:
    """What posts each XID straight to Alertmanager (None when not configured)."""
    if not settings.alertmanager_urls or settings.node is None:
        return None
    alerts = FastAlerts(settings.alertmanager_urls, credential=settings.alertmanager_credential)
    node = settings.node

    def post(identity: GpuIdentity, xid: int) -> None:
        alerts.post("GpuXidErrors", {
            "node": node, "gpu": str(identity.index), "uuid": identity.uuid,
            "name": identity.name, "xid": str(xid), "severity": "critical",
            "component": "gpu"}, f"GPU {identity.index} on {node} reported XID {xid}")
    return post


def build(settings: Settings, nvml: Any, simulated: bool) -> tuple[CollectionLoop, ExpositionApp]:
    """The loop and the app serving it: GPU series plus process metrics only (the default
    gc/platform collectors cost RSS and scrape time and say nothing about GPUs)."""
    attributor = None
    if settings.process_attribution:
        source = read_proc_environ
        if simulated:  # the fake NVML
            fake = nvml

            def source(pid: int) -> Any:  # simulated processes carry their environment
                return fake.process_environ(pid) or read_proc_environ(pid)
        attributor = ProcessAttributor(source)
    loop = CollectionLoop(nvml, interval=settings.interval, deadline=settings.cycle_deadline,
                          attributor=attributor, watch_xid=settings.xid_events,
                          read_nvlink=settings.nvlink, read_gpm=settings.gpm,
                          on_xid=fast_xid(settings))
    return loop, ExpositionApp(GpuCollector(loop, simulated))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = resolve(args)
        nvml, simulated = load_nvml(settings.simulate or None)
    except (ConfigError, ScenarioError, OSError, TypeError) as exc:
        print(f"gpu-exporter: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loop, app = build(settings, nvml, simulated)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server, _ = serve(app, settings.bind, settings.port)
    except OSError as exc:
        print(f"gpu-exporter: cannot listen on {settings.bind}:{settings.port}: {exc.strerror}",
              file=sys.stderr)
        return 1
    loop.start()
    log.info("serving on %s:%d (interval %.1fs, simulated=%s)", settings.bind, settings.port,
             settings.interval, simulated)
    stop.wait()
    log.info("stopping")
    server.shutdown()
    server.server_close()
    loop.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
