#!/usr/bin/env bash
# Stops everything the local deployment started (its dedicated supervisord and all services).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/ansible-playbook -i ansible/inventories/local ansible/stop.yml
