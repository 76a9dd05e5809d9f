#!/usr/bin/env bash
# Stops everything the local deployment started (its dedicated supervisord and all services),
# with the collection the deployment installed (scripts/demo.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_COLLECTIONS_PATH="$PWD/.stack/collections"
exec .venv/bin/ansible-playbook -i ansible/inventories/local trainwatch.stack.stop
