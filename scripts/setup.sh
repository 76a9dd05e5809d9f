#!/usr/bin/env bash
# Installs what Trainwatch needs on a fresh Debian machine, idempotently. Safe to re-run.
#
#   bash scripts/setup.sh          what the demo needs (scripts/demo.sh runs this): Debian's
#                                  Prometheus, Alertmanager and node_exporter binaries,
#                                  supervisor and python3-venv; a virtualenv (.venv) with the
#                                  project's `stack` extra and PyTorch's CPU wheel.
#   bash scripts/setup.sh --tests  that, plus what only the test suite needs (scripts/test.sh
#                                  runs this): Slurm, munge, PostgreSQL, VictoriaMetrics, ruby,
#                                  podman/runc/docker-compose, npm, and the dev extras.
#   bash scripts/setup.sh --list [--tests]
#                                  print the Debian packages it would install, one a line, and
#                                  install nothing (tests/test_setup_lists.py reads them).
#
# No host-wide service block: packages are installed as Debian installs them; the system-wide
# services of the packages this script newly installs (Trainwatch runs its own copies under
# its prefix) are then stopped and disabled, and nothing else on the host is touched.
set -euo pipefail
cd "$(dirname "$0")/.."

tests=false
list=false
for arg in "$@"; do
  case "$arg" in
    --tests) tests=true ;;
    --list) list=true ;;
    *) echo "usage: bash scripts/setup.sh [--list] [--tests]" >&2; exit 2 ;;
  esac
done

DEB_PACKAGES=(prometheus prometheus-alertmanager prometheus-node-exporter supervisor python3-venv)
# package -> the system-wide service its install starts (stopped again: Trainwatch runs its own)
declare -A SERVICES=([prometheus]=prometheus [prometheus-alertmanager]=prometheus-alertmanager
                     [prometheus-node-exporter]=prometheus-node-exporter [supervisor]=supervisor
                     [postgresql]=postgresql [victoria-metrics]=victoria-metrics
                     [slurmctld]=slurmctld [slurmd]=slurmd [munge]=munge)
if $tests; then
  # ruby: its Regexp (Onigmo) runs the generated Logstash patterns in tests/logs.
  DEB_PACKAGES+=(ruby)
  # postgresql: tests start throwaway clusters with its initdb/pg_ctl (as nobody when root).
  DEB_PACKAGES+=(postgresql)
  # victoria-metrics: the long-term store Prometheus remote-writes to (tests/rules/test_victoriametrics.py)
  DEB_PACKAGES+=(victoria-metrics)
  # docker-compose (`config -q` on compose/), podman + runc (build and run the compose images
  # without a Docker engine or systemd): tests/field_checks/
  DEB_PACKAGES+=(docker-compose podman runc)
  # npm (with Node.js): Grafana's own dashboard schema and the TypeScript compiler, pinned in
  # dashboards/schema/ (tests/dashboards/test_grafana_schema.py); a Node.js already installed
  # otherwise is used as it is
  command -v npm >/dev/null 2>&1 && ! $list || DEB_PACKAGES+=(npm)
  # slurmctld, slurmd, slurm-client, munge: tests/slurm start a cluster of their own under a
  # tmp dir (one `slurmd -N` per node, a munge key of its own), never the machine's.
  DEB_PACKAGES+=(slurmctld slurmd slurm-client munge)
fi
if $list; then
  printf '%s\n' "${DEB_PACKAGES[@]}"
  exit 0
fi
missing=()
for pkg in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing Debian packages: ${missing[*]}"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
  # The services these packages started system-wide: stopped and disabled (only those this
  # run installed; a service that was already on the host is left as it is).
  for pkg in "${missing[@]}"; do
    service=${SERVICES[$pkg]:-}
    [ -n "$service" ] || continue
    if [ -d /run/systemd/system ]; then
      $SUDO systemctl disable --now "$service" >/dev/null 2>&1 || true
    elif [ -x "/etc/init.d/$service" ]; then
      $SUDO "/etc/init.d/$service" stop >/dev/null 2>&1 || true
      $SUDO update-rc.d "$service" disable >/dev/null 2>&1 || true
    fi
  done
fi

if $tests; then
  # As root, podman keeps a blob-info cache in /var/lib/containers whatever --root says;
  # tests/field_checks/test_images.py binds a tmp dir over it (the mount point must exist).
  if [ "$(id -u)" -eq 0 ]; then mkdir -p /var/lib/containers; fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi
# PyTorch's CPU build, by its local version `+cpu`: the default index (PyPI) has only the CUDA
# build under the plain version, which would pull gigabytes of CUDA libraries. pip's own
# configured sources are tried first (a local wheel, a mirror); else PyTorch's CPU index,
# TRAINWATCH_TORCH_INDEX_URL (default below), for torch alone.
TORCH=torch==2.13.0+cpu
TORCH_INDEX=${TRAINWATCH_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
install_torch() {
  .venv/bin/python -c "import torch" 2>/dev/null && return 0
  echo "==> installing PyTorch's CPU wheel ($TORCH)"
  .venv/bin/pip install "$TORCH" 2>/dev/null && return 0
  echo "    not in pip's configured sources: from PyTorch's CPU index $TORCH_INDEX"
  .venv/bin/pip install --index-url "$TORCH_INDEX" "$TORCH"
}
# The test install includes the demo's: a .venv set up for the tests serves the demo too.
full_stamp=.venv/.trainwatch-installed
if $tests; then
  extras="stack,dev,forwarders,fast,postgresql"; stamp=$full_stamp
else
  extras=stack; stamp=.venv/.trainwatch-installed-demo
  [ -f "$full_stamp" ] && [ ! pyproject.toml -nt "$full_stamp" ] && stamp=$full_stamp
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install --upgrade pip >/dev/null 2>&1 || true
  install_torch
  echo "==> installing the project into .venv (.[$extras])"
  # pipefail (set above) makes a failed pip fail the script; the filter only drops noise.
  .venv/bin/pip install -e ".[$extras]" 2>&1 | { grep -v '^WARNING: Location' || true; }
  .venv/bin/python -c "import torch, trainwatch.exporters, trainwatch.remediation, ansible_runner"
  touch "$stamp"
fi

if $tests; then
  # The published distributions whose import names Trainwatch used to take (`exporters`,
  # `remediation`), as wheels: tests/packaging/test_namespace.py installs them beside
  # Trainwatch, offline.
  namesakes=.venv/namesakes
  if [ ! -f "$namesakes/.complete" ]; then
    echo "==> downloading the namesake distributions for the namespace test"
    .venv/bin/pip wheel --no-deps -w "$namesakes" exporters==0.7.0 remediation==0.1.0 \
      2>&1 | { grep -v '^WARNING: Location' || true; }
    touch "$namesakes/.complete"
  fi
  schema_lock=dashboards/schema/package-lock.json
  schema_stamp=dashboards/schema/node_modules/.trainwatch-installed
  if [ ! -f "$schema_stamp" ] || [ "$schema_lock" -nt "$schema_stamp" ]; then
    echo "==> installing the pinned dashboard schema (npm ci in dashboards/schema)"
    (cd dashboards/schema && npm ci --no-audit --no-fund)
    touch "$schema_stamp"
  fi
fi
echo "==> setup complete"
