#!/usr/bin/env bash
# Build llama.cpp's llama-bench and llama-batched-bench from the llama.cpp that PyPI's
# llama-cpp-python sdist vendors, for the side-by-side benchmark (benchmarks/bench_cpu.py). Not part
# of CI. Two builds; in both, ggml rounds the activations to bf16 before a bf16 weight meets them
# (det-infer keeps them fp32), and sums in its own order:
#   build/llamacpp/build       native (-DGGML_NATIVE=ON): on a CPU with AVX512-BF16 the bf16 dot
#                              products use vdpbf16ps, two bf16 products per fp32 lane per op;
#   build/llamacpp/build-fp32  AVX-512 without AVX512-BF16 (only on a CPU with AVX-512 F/BW/DQ/VL):
#                              both operands widened to fp32 and multiplied with fp32 fma, as the
#                              contract multiplies, 16 lanes at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
dest=build/llamacpp
src="$dest/llama_cpp_python-$VERSION/vendor/llama.cpp"
targets=(llama-bench llama-batched-bench)
built() { for t in "${targets[@]}"; do [ -x "$1/bin/$t" ] || return 1; done; }
fp32=1
for f in avx512f avx512bw avx512dq avx512vl; do grep -qw "$f" /proc/cpuinfo || fp32=0; done
if built "$dest/build" && { [ $fp32 = 0 ] || built "$dest/build-fp32"; } && [ -d "$dest/pydeps/sentencepiece" ]; then
  echo "llama.cpp already built in $dest"; exit 0
fi
mkdir -p "$dest"
[ -d "$src" ] || {
  .venv/bin/pip download --no-deps --no-binary :all: -q -d "$dest" "llama-cpp-python==$VERSION"
  tar -xzf "$dest/llama_cpp_python-$VERSION.tar.gz" -C "$dest"
}
# convert_hf_to_gguf.py imports sentencepiece even for BPE tokenizers; kept out of .venv.
.venv/bin/pip install -q --no-deps --target "$dest/pydeps" sentencepiece==0.2.1
common=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
        -DLLAMA_BUILD_SERVER=OFF)
cmake -S "$src" -B "$dest/build" "${common[@]}" -DGGML_NATIVE=ON > "$dest/cmake.log"
cmake --build "$dest/build" -j 2 --target "${targets[@]}" > "$dest/build.log"
echo "built ${targets[*]} in $dest/build"
if [ $fp32 = 1 ]; then
  cmake -S "$src" -B "$dest/build-fp32" "${common[@]}" -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
    -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_BF16=OFF > "$dest/cmake-fp32.log"
  cmake --build "$dest/build-fp32" -j 2 --target "${targets[@]}" > "$dest/build-fp32.log"
  echo "built ${targets[*]} in $dest/build-fp32"
else
  echo "no AVX-512 F/BW/DQ/VL on this CPU: build-fp32 skipped"
fi
