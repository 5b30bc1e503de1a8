#!/usr/bin/env bash
# The GPU check, one call of a few minutes on a lent GPU machine (docs/RESULTS.md records its
# output). Builds the CPU and CUDA variants for the torch there, runs the CUDA tests (the GPU must
# reproduce the CPU-pinned contract digest and every synthetic model's certificate digests bit for
# bit, over a geometry sweep, batch 16, single launch and per step) and the CPU contract tests,
# benchmarks the megakernel's decode (benchmarks/bench_gpu.py), and writes a short report to the
# folder given as $1 (default: $OUT, else /tmp/device_check).
#   here:   bash scripts/fetch_device_wheels.sh
#   device: run(command="bash scripts/device_check.sh", carry=[".whl"], timeout_s=480)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp/device_check}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  "$CUDA_HOME/bin/nvcc" --version | tail -2
} 2>&1 | tee "$out/machine.txt"

start=$(date +%s)
python3 scripts/build_local.py --backend cpu > "$out/build.log" 2>&1 \
  && python3 scripts/build_local.py --backend cuda >> "$out/build.log" 2>&1
build_rc=$?
echo "build rc=$build_rc in $(( $(date +%s) - start )) s" | tee -a "$out/machine.txt"
tail -3 "$out/build.log"

python3 -m pytest -q -p no:cacheprovider tests/test_cuda_device.py tests/test_contract_math.py \
  tests/test_rope.py "tests/test_build_invariance.py::test_kernel_ops_digest" 2>&1 | tee "$out/pytest.txt"
test_rc=${PIPESTATUS[0]}

LOCAL_KERNELS="phanerozoic/det-infer=$PWD/build" python3 benchmarks/contract_accuracy.py --n 2000000 --device cuda \
  2>&1 | tee "$out/accuracy_cuda.md"
LOCAL_KERNELS="phanerozoic/det-infer=$PWD/build" timeout 150 python3 benchmarks/bench_gpu.py --steps 128 --reps 3 \
  2>&1 | tee "$out/bench_gpu.md"
echo "device_check: build rc=$build_rc, tests rc=$test_rc" | tee -a "$out/machine.txt"
exit $(( build_rc || test_rc ))
