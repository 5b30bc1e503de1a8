#!/usr/bin/env bash
# Builds and runs benchmarks/tile_ceiling.cpp on one core (x86-64 with AVX-512VL; not part of CI).
# The kernel is compiled with the engine's own flags from build.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/tile_ceiling
mkdir -p build
g++ -O3 -std=c++17 -ffp-contract=off -fno-fast-math -fopenmp -o "$out" benchmarks/tile_ceiling.cpp \
  det_infer_cpu/x86/det_gemv_tile_avx512.cpp det_infer_cpu/x86/det_nf4_decode.cpp det_infer_cpu/det_kernels_cpu.cpp \
  det_infer_cpu/x86/det_gemv_avx2.cpp det_infer_cpu/x86/det_gemv_b1_avx512.cpp det_infer_cpu/x86/det_attn_avx2.cpp \
  det_infer_cpu/x86/det_act_avx2.cpp det_infer_cpu/x86/det_act_avx512.cpp
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), one core"
taskset -c 0 "$out"
