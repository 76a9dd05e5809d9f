#!/usr/bin/env bash
# The README's first command: set up this machine, deploy the local stack with Ansible, run a
# real 2-rank training job with an injected loss spike, and print how the stack cut it down.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "==> building the trainwatch.stack collection (ansible/) and installing it into .stack/collections"
.venv/bin/python -m scripts.collection install --path .stack/collections
export ANSIBLE_COLLECTIONS_PATH="$PWD/.stack/collections"
echo "==> deploying the local stack (ansible-playbook -i ansible/inventories/local trainwatch.stack.site)"
# The checkout's .venv/bin/trainwatch gets the demo's addresses too (the operator CLI reads
# etc/trainwatch/cli.yml of the environment it runs from): `trainwatch status`, no flag.
cli_files="[\"{{ trainwatch_venv_dir }}/etc/trainwatch/cli.yml\", \"$PWD/.venv/etc/trainwatch/cli.yml\"]"
.venv/bin/ansible-playbook -i ansible/inventories/local trainwatch.stack.site \
  -e "{\"remediation_cli_config_files\": $cli_files}"
echo "==> running the demo job"
exec .venv/bin/python scripts/demo_timeline.py --prefix .stack "$@"
