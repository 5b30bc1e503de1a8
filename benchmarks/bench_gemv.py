#!/usr/bin/env python3
"""The engine's GEMV alone (`ops._test_gemv_engine`), bf16 against nf4, at batch 1 on SmolLM2-135M's
shapes: one matrix called repeatedly (in cache when it fits), and a set of matrices larger than the
caches (weights from memory). Medians of 7 and 5 timings; prints a markdown table.
DET_INFER_GEMV=avx2 (or ref) caps the ISA level for an A/B run.

    .venv/bin/python benchmarks/bench_gemv.py [--threads 2]
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(1536, 576), (576, 1536), (49152, 576)]  # gate/up, down, lm_head


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    import torch
    from kernels import get_kernel

    torch.set_num_threads(args.threads)
    di = get_kernel("phanerozoic/det-infer", version=1)
    gen = torch.Generator().manual_seed(0)
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {args.threads} threads, batch 1")
    print("| shape | weights | where | version | us per GEMV | Gweights/s | GB/s of weights |")
    print("|---|---|---|---|---|---|---|")
    for N, K in SHAPES:
        x = torch.randn(1, K, generator=gen)
        out = torch.empty(1, N)
        for where in ("one matrix repeated", "more than the caches"):
            count = 1 if where == "one matrix repeated" else max(2, int(300e6 // (N * K * 2)))
            dense = [torch.randn(N, K, generator=gen).to(torch.bfloat16) for _ in range(count)]
            packed = [(torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=gen),
                       torch.rand(N * K // 64, generator=gen) + 0.1) for _ in range(count)]
            for kind, call, nbytes in (
                    ("bf16", lambda i: di.ops._test_gemv_engine(out, dense[i], x), 2 * N * K),
                    ("nf4", lambda i: di.ops._test_gemv_engine(out, packed[i][0], x, packed[i][1]), N * K // 2 + N * K // 16)):
                version = call(0)
                reps, inner = (7, 200) if where == "one matrix repeated" else (5, 1)
                times = []
                for _ in range(reps):
                    t = time.perf_counter()
                    for _ in range(inner):
                        for i in range(count):
                            call(i)
                    times.append((time.perf_counter() - t) / (inner * count))
                t = statistics.median(times)
                print(f"| {N} x {K} | {kind} | {where} | {version} | {t * 1e6:.1f} | {N * K / t / 1e9:.2f} | "
                      f"{nbytes / t / 1e9:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
