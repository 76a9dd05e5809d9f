"""The exporter's own `process_*` series, read from /proc/self as prometheus_client does.

Same names, HELP texts and sources as prometheus_client's ProcessCollector (so dashboards
and the exporter-memory checks read the same series as before), without importing
prometheus_client (see exporters/node/gpu/text_format.py for why). Linux only, like /proc; where
/proc cannot be read the series are simply absent.
"""

from __future__ import annotations

import contextlib
import os
import resource

from trainwatch.exporters.node.gpu.text_format import Family, counter, gauge

_PAGESIZE = resource.getpagesize()
_TICKS = float(os.sysconf("SC_CLK_TCK"))


def _boot_time(proc: str) -> float:
    try:
        with open(os.path.join(proc, "stat"), "rb") as stat:
            for line in stat:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


class ProcessMetrics:
    """`collect()` yields the families for /proc/<pid> (default: this process)."""

    def __init__(self, proc: str = "/proc", pid: str = "self") -> None:
        self._proc = proc
        self._pid = pid
        self._btime = _boot_time(proc)

    def collect(self) -> list[Family]:
        if not self._btime:
            return []
        pid = os.path.join(self._proc, self._pid)
        result: list[Family] = []
        try:
            with open(os.path.join(pid, "stat"), "rb") as stat:
                parts = stat.read().split(b")")[-1].split()
            result += [
                gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                      value=float(parts[20])),
                gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
                      value=float(parts[21]) * _PAGESIZE),
                gauge("process_start_time_seconds",
                      "Start time of the process since unix epoch in seconds.",
                      value=float(parts[19]) / _TICKS + self._btime),
                counter("process_cpu_seconds_total",
                        "Total user and system CPU time spent in seconds.",
                        value=(float(parts[11]) + float(parts[12])) / _TICKS),
            ]
        except OSError:
            pass
        try:
            max_fds = None
            with open(os.path.join(pid, "limits"), "rb") as limits:
                for line in limits:
                    if line.startswith(b"Max open file"):
                        with contextlib.suppress(ValueError):  # "unlimited"
                            max_fds = float(line.split()[3])
                        break
            open_fds = len(os.listdir(os.path.join(pid, "fd")))
            result.append(gauge("process_open_fds", "Number of open file descriptors.",
                                value=float(open_fds)))
            if max_fds is not None:
                result.append(gauge("process_max_fds",
                                    "Maximum number of open file descriptors.", value=max_fds))
        except OSError:
            pass
        return result
