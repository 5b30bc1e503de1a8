#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
exec .venv/bin/python -m pytest "$@"
