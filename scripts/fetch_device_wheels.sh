#!/usr/bin/env bash
# Download, here, the wheels the GPU machine lacks (its image has torch, nvcc, pytest, numpy,
# mpmath, transformers, but not `kernels`) into .whl/ (git-ignored). scripts/device_check.sh
# installs them there; name .whl in the device run's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "$(grep '^kernels==' requirements.txt)"
ls .whl
