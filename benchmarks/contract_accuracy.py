#!/usr/bin/env python3
"""Accuracy and throughput of the contract functions on the CPU engine; prints the markdown
table recorded in docs/RESULTS.md §1.

    LOCAL_KERNELS=phanerozoic/det-infer=build .venv/bin/python benchmarks/contract_accuracy.py [--n 10000000]

Accuracy: det_fixtures/accuracy.py (numpy float64/longdouble references, mpmath for every disagreement).
Throughput: median of 5 timed calls over the same inputs, all threads.
"""
import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from det_fixtures import accuracy


def sync(result):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result


def timed(f, reps=5):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    return out, statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU executor")
    args = ap.parse_args()
    from kernels import get_kernel

    di = get_kernel("phanerozoic/det-infer", version=1)
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
    print(f"executor: {args.device} ({where}), torch {torch.__version__}")
    print("| function | inputs | max error (ulp) | correctly rounded | worst input | Mvalues/s |")
    print("|---|---|---|---|---|---|")
    for fn in ("exp", "tanh", "silu", "gelu_tanh", "rsqrt", "log"):
        x = accuracy.inputs(fn, args.n)
        xt = torch.from_numpy(x).to(args.device)
        y, sec = timed(lambda: sync(di.contract.unary(xt, fn)))
        y = y.cpu()
        r = accuracy.judge(fn, x, y.numpy())
        print(f"| {fn} | {r['n']:,} | {r['max_ulp']:.7f} | {100 * r['correctly_rounded']:.5f}% | "
              f"{r['worst_input']:.9g} | {len(x) / sec / 1e6:.0f} |")
    theta = accuracy.angles(args.n)
    tt = torch.from_numpy(theta).to(args.device)
    (s, c), sec = timed(lambda: sync(di.contract.sincos(tt)))
    s, c = s.cpu(), c.cpu()
    for name, y in (("sin", s), ("cos", c)):
        r = accuracy.judge(name, theta, y.numpy())
        print(f"| {name} (fp64 angle) | {r['n']:,} | {r['max_ulp']:.7f} | {100 * r['correctly_rounded']:.5f}% | "
              f"{r['worst_input']:.9g} | {len(theta) / sec / 1e6:.0f} (pair) |")


if __name__ == "__main__":
    main()
