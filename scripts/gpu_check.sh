#!/usr/bin/env bash
# One command for a GPU host (see scripts/gpu_check.py): the GPU exporter against the real
# driver and nvidia-smi, a short CUDA DDP job, its attribution, GPM and MFU series, a summary.
# Needs only this project's Python dependencies and the host's PyTorch with CUDA, in the
# interpreter $PYTHON (default: python3), e.g.:
#   python3 -m pip install -e '.[stack]'   # once, into the environment that has CUDA PyTorch
#   bash scripts/gpu_check.sh --steps 300 --gpus 2
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
