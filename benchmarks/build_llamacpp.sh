#!/usr/bin/env bash
# Build llama.cpp's llama-bench from the llama.cpp that PyPI's llama-cpp-python
# sdist vendors, for the side-by-side benchmark (benchmarks/bench_cpu.py). Not part of CI.
# Output: build/llamacpp/ (source, build tree, bin/).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
dest=build/llamacpp
src="$dest/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ -x "$dest/build/bin/llama-bench" ] && [ -d "$dest/pydeps/sentencepiece" ]; then
  echo "llama.cpp already built in $dest"; exit 0
fi
mkdir -p "$dest"
[ -d "$src" ] || {
  .venv/bin/pip download --no-deps --no-binary :all: -q -d "$dest" "llama-cpp-python==$VERSION"
  tar -xzf "$dest/llama_cpp_python-$VERSION.tar.gz" -C "$dest"
}
# convert_hf_to_gguf.py imports sentencepiece even for BPE tokenizers; kept out of .venv.
.venv/bin/pip install -q --no-deps --target "$dest/pydeps" sentencepiece==0.2.1
cmake -S "$src" -B "$dest/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > "$dest/cmake.log"
cmake --build "$dest/build" -j 2 --target llama-bench > "$dest/build.log"
echo "built $dest/build/bin/llama-bench"
