#!/usr/bin/env bash
# The whole test suite: sets up what it needs (scripts/setup.sh --tests: the demo's packages
# and the test-only ones, Slurm, PostgreSQL, podman, npm, ruby, VictoriaMetrics), then runs pytest.
#
# pytest-xdist runs the test files on two workers per core (at most 4): a test spends much of
# its time waiting on the real services it started (scrape and evaluation intervals, Slurm's
# scheduling pass, an alert's `for:`, a job's steps): on a 2-core machine two workers took
# 47 minutes, four took 41 with the cores 96 % busy. `--dist loadfile` keeps each file on one
# worker, so a module's shared fixture (the loopback cluster, the molecule scenario) is built
# once. Files are handed out longest first (tests/support/order.py; xdist's own reorder, most
# tests first, is switched off), so the long ones do not start last. The temporary root is
# short because UNIX socket paths (108 bytes) and podman's runroot (50) must fit under it.
# Extra arguments go to pytest (`-n 0` runs in this process).
#
# pytest's exit code 5 ("no tests collected") is treated as a failure: a suite that ran
# nothing has not passed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests || exit 1
workers=$(( $(nproc 2>/dev/null || echo 1) * 2 ))
[ "$workers" -gt 4 ] && workers=4
[ "$workers" -lt 2 ] && workers=2
tmp_root=$(mktemp -d /tmp/twXXXX)
.venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder \
  --basetemp "$tmp_root" \
  --durations 25 "$@"
rc=$?
if [ "$rc" -eq 0 ]; then
  rm -rf "$tmp_root"
else
  echo "test files kept under $tmp_root" >&2
fi
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as failure" >&2
  exit 1
fi
exit "$rc"
