"""One rank of a job, without torch: the rank client in a plain process, for the tests that
watch how a rank's process ends (tests/training/test_fast_killed_rank.py).

Reports a step every 0.05 s; `--end` says how it ends: `run` (never: it waits to be killed),
`raise` (an exception of its own after a few steps, which the monitor reports as it exits)
or `finish` (a clean end after a few steps). Prints "reporting" once its first datagram is out.
Rank, world size and job name come from the environment, as under a launcher.
"""

from __future__ import annotations

import argparse
import itertools
import time

from trainwatch.exporters.rank.client import TrainingMonitor

ENDS_AFTER_STEPS = 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--end", choices=("run", "raise", "finish"), required=True)
    end = parser.parse_args().end
    with TrainingMonitor(control=False, flush_interval=0.05) as monitor:
        for step in itertools.count():
            monitor.report(step, loss=1.0, samples=1)
            if step == 2:
                print("reporting", flush=True)
            if step == ENDS_AFTER_STEPS and end == "raise":
                raise RuntimeError("this rank's own error: the monitor says it is exiting")
            if step == ENDS_AFTER_STEPS and end == "finish":
                break
            time.sleep(0.05)


if __name__ == "__main__":
    main()
