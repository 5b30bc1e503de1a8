#!/usr/bin/env bash
# Set up this checkout on a fresh machine, idempotently (a second run with nothing changed takes
# seconds): system compilers for the portability tests, the pinned virtual environment at .venv,
# the CUDA audit tools under .tools/, and the kernel build under build/ (CPU variant always, the
# CUDA variant too where torch has CUDA and nvcc exists).
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"

stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

# 1. Debian packages used by tests/test_build_invariance.py (clang, aarch64 cross-gcc, qemu-user).
missing=()
command -v clang++-16 >/dev/null || missing+=(clang-16)
command -v aarch64-linux-gnu-g++ >/dev/null || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: not root, cannot install ${missing[*]}; their tests will be skipped" >&2
  fi
fi

# 2. The virtual environment, reinstalled only when a requirements file changes.
[ -x .venv/bin/python ] || python3.11 -m venv .venv
req_hash=$(cat requirements.txt requirements-nodeps.txt | sha256sum | cut -d' ' -f1)
if ! stamp_ok .venv/.requirements.sha256 "$req_hash"; then
  .venv/bin/pip install --disable-pip-version-check -q -r requirements.txt
  .venv/bin/pip install --disable-pip-version-check -q --no-deps -r requirements-nodeps.txt
  echo "$req_hash" > .venv/.requirements.sha256
fi

# The repository root on the environment's path, for det_fixtures (the models, inputs and pins the
# tests, scripts and benchmarks share).
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$PWD" > "$site/det_infer_repo.pth"

# 3. cuobjdump and nvdisasm for the SASS audit.
tools_hash=$(sha256sum requirements-tools.txt | cut -d' ' -f1)
if ! stamp_ok .tools/.requirements.sha256 "$tools_hash"; then
  rm -rf .tools && mkdir -p .tools
  for pkg in $(grep -v '^#' requirements-tools.txt); do
    name=${pkg%%==*}; dir=.tools/${name#nvidia-cuda-}
    .venv/bin/pip install --disable-pip-version-check -q --no-deps --target "$dir" "$pkg"
  done
  chmod +x .tools/*/nvidia/*/bin/* 2>/dev/null || true
  echo "$tools_hash" > .tools/.requirements.sha256
fi

# 4. The kernel build (a no-op when nothing changed).
.venv/bin/python scripts/build_local.py --backend cpu
if .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  .venv/bin/python scripts/build_local.py --backend cuda
fi
