#!/usr/bin/env bash
# Build llama.cpp's llama-bench from the llama.cpp that PyPI's llama-cpp-python
# sdist vendors, for the side-by-side benchmark (benchmarks/bench_cpu.py). Not part of CI.
# Output: build/llamacpp/ (source, build tree, bin/).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
dest=build/llamacpp
if [ -x "$dest/build/bin/llama-bench" ]; then echo "llama.cpp already built in $dest"; exit 0; fi
mkdir -p "$dest"
.venv/bin/pip download --no-deps --no-binary :all: -q -d "$dest" "llama-cpp-python==$VERSION"
tar -xzf "$dest/llama_cpp_python-$VERSION.tar.gz" -C "$dest"
src="$dest/llama_cpp_python-$VERSION/vendor/llama.cpp"
cmake -S "$src" -B "$dest/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > "$dest/cmake.log"
cmake --build "$dest/build" -j 2 --target llama-bench > "$dest/build.log"
ln -sfn "$(cd "$src" && pwd)" "$dest/src"
echo "built $dest/build/bin/llama-bench"
