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
.venv/bin/ansible-playbook -i ansible/inventories/local trainwatch.stack.site
echo "==> running the demo job"
exec .venv/bin/python scripts/demo_timeline.py --prefix .stack "$@"
