#!/usr/bin/env bash
# The whole test suite: sets up what it needs (scripts/setup.sh), then runs pytest.
# pytest's exit code 5 ("no tests collected") is treated as a failure: a suite that ran
# nothing has not passed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as failure" >&2
  exit 1
fi
exit "$rc"
