#!/usr/bin/env bash
# Download, here, every wheel the GPU machine may need to run the kernel through `kernels`, into
# .whl/ (git-ignored; name it in the device run's carry list). The device machine has no network
# and its image has torch, nvcc, pytest, numpy, mpmath, safetensors, transformers, huggingface_hub,
# but not `kernels` (0.17 needs huggingface_hub >= 1.10, sigstore and their closure).
#
# What is downloaded: kernels' whole dependency closure for CPython 3.12 on manylinux x86-64 (the
# device's Python), every version pinned by requirements.txt (the versions this checkout is tested
# with), one version of each; `device_check.py check-wheels` then proves the set is complete and
# pinned. About 45 wheels, ~23 MB: the working tree and .whl must stay under the device's 64 MiB.
#
# What is installed there: scripts/device_check.sh's preflight resolves the closure against the
# device's own packages (`device_check.py install-wheels`): it keeps each installed distribution
# whose version satisfies everything that requires it (huggingface_hub 1.33 there does) and installs
# only the rest, with pip --no-index --no-deps --target. DET_CHECK_WHEELS=all installs every wheel.
#   here:   bash scripts/fetch_device_wheels.sh
#   device: run(command="bash scripts/device_check.sh", carry=[".whl"], timeout_s=...)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
kernels_pin=$(grep -E '^kernels==' requirements.txt)
constraints=$(mktemp) log=$(mktemp)
trap 'rm -f "$constraints" "$log"' EXIT
grep -E '^[A-Za-z0-9_.-]+==' requirements.txt > "$constraints"

rm -rf .whl && mkdir -p .whl
status=0
"$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
  -c "$constraints" -d .whl "$kernels_pin" > "$log" 2>&1 || status=$?
grep -v "is ignored: it is neither a file nor a directory" "$log" || true
[ "$status" = 0 ] || { echo "fetch_device_wheels: pip download failed ($status)" >&2; exit 1; }
"$PY" scripts/device_check.py check-wheels --wheels .whl
echo "fetch_device_wheels: $(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/ (carry it: carry=[\".whl\"])"
