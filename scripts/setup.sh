#!/usr/bin/env bash
# Installs everything Trainwatch needs on a fresh Debian machine, idempotently:
# Debian packages for the real Prometheus stack and a process supervisor, and a virtualenv
# (.venv) with the project, PyTorch (CPU wheel) and the dev tools. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(prometheus prometheus-alertmanager prometheus-node-exporter supervisor python3-venv)
# ruby: its Regexp (Onigmo) runs the generated Logstash patterns in tests/logs.
DEB_PACKAGES+=(ruby)
# postgresql: the remediation store that spans hosts (issue 14); tests start throwaway
# clusters with its initdb/pg_ctl (as nobody when run as root), the deploy its role.
DEB_PACKAGES+=(postgresql)
# victoria-metrics: the long-term store Prometheus remote-writes to (tests/rules/test_victoriametrics.py)
DEB_PACKAGES+=(victoria-metrics)
# docker-compose (`config -q` on compose/), podman + runc (build and run the compose images
# without a Docker engine or systemd): tests/field_checks/
DEB_PACKAGES+=(docker-compose podman runc)
# npm (with Node.js): Grafana's own dashboard schema and the TypeScript compiler, pinned in
# dashboards/schema/ (tests/dashboards/test_grafana_schema.py); a Node.js already installed
# otherwise is used as it is
command -v npm >/dev/null 2>&1 || DEB_PACKAGES+=(npm)
# slurmctld, slurmd, slurm-client, munge: the real scheduler the remediation service drains
# nodes and requeues jobs in (issue 23); tests/slurm start a cluster of their own under a tmp
# dir (one `slurmd -N` per node, a munge key of its own), never the machine's.
DEB_PACKAGES+=(slurmctld slurmd slurm-client munge)
missing=()
for pkg in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # The packages' init scripts must not start system-wide copies: Trainwatch runs its own.
  # Only when the host has no policy of its own, and removed even if the install fails.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# As root, podman keeps a blob-info cache in /var/lib/containers whatever --root says;
# tests/field_checks/test_images.py binds a tmp dir over it (the mount point must exist).
if [ "$(id -u)" -eq 0 ]; then mkdir -p /var/lib/containers; fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.trainwatch-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "==> installing Python packages into .venv (torch CPU wheel, project, dev tools)"
  .venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
  # pipefail (set above) makes a failed pip fail the script; the filter only drops noise.
  # The CPU build by name (its local version `+cpu`): a stock index has only the CUDA build
  # under the plain version, which would install gigabytes of CUDA libraries here. Give pip
  # PyTorch's CPU wheel index (PIP_EXTRA_INDEX_URL) where no local wheel is configured.
  .venv/bin/pip install -q "torch==2.13.0+cpu" 2>&1 | { grep -v '^WARNING: Location' || true; }
  .venv/bin/pip install -q -e ".[stack,dev,forwarders,fast,postgresql]" 2>&1 | { grep -v '^WARNING: Location' || true; }
  .venv/bin/python -c "import torch, trainwatch.exporters, trainwatch.remediation, pytest, ansible_runner"
  touch "$stamp"
fi
# The published distributions whose import names Trainwatch used to take (`exporters`,
# `remediation`), as wheels: tests/packaging/test_namespace.py installs them beside Trainwatch,
# offline.
namesakes=.venv/namesakes
if [ ! -f "$namesakes/.complete" ]; then
  echo "==> downloading the namesake distributions for the namespace test"
  .venv/bin/pip wheel -q --no-deps -w "$namesakes" exporters==0.7.0 remediation==0.1.0 \
    2>&1 | { grep -v '^WARNING: Location' || true; }
  touch "$namesakes/.complete"
fi
schema_lock=dashboards/schema/package-lock.json
schema_stamp=dashboards/schema/node_modules/.trainwatch-installed
if [ ! -f "$schema_stamp" ] || [ "$schema_lock" -nt "$schema_stamp" ]; then
  echo "==> installing the pinned dashboard schema (npm ci in dashboards/schema)"
  (cd dashboards/schema && npm ci --no-audit --no-fund --loglevel=error)
  touch "$schema_stamp"
fi
echo "==> setup complete"
