#!/usr/bin/env bash
# The release matrix (docs/RESULTS.md §10): CUDA toolchains 12.6, 12.8, 13.0, 13.2 from PyPI and the
# machine's nvcc compile and audit the megakernel for every architecture each supports; the CPU
# variant (torch 2.13 CPU) and a CUDA variant (torch 2.14.1+cu130, in its own venv) are built,
# loaded with kernels.get_local_kernel without a GPU, and ABI-checked. scripts/build_matrix.py has
# the details; everything large goes under the cache folder, never into the repository or .venv.
#   bash scripts/build_matrix.sh                   # the full matrix (downloads ~6 GB the first time)
#   bash scripts/build_matrix.sh --quick           # what CI covers: system nvcc, all archs; CPU variant
#   MATRIX_CACHE=/work/matrix-cache bash scripts/build_matrix.sh --toolchains cu126,cu132 --variants none
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
[ -x .venv/bin/python ] || bash scripts/setup.sh
exec nice -n 10 .venv/bin/python scripts/build_matrix.py "$@"
