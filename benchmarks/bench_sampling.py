#!/usr/bin/env python3
"""What seeded sampling costs on the CPU engine (docs/RESULTS.md §7): generate on SmolLM2-135M-Instruct
(bf16), greedy against sampled (temperature 0.8, top_p 0.9), one sequence and a batch of 16, medians
of --reps runs in this one process.

    .venv/bin/python benchmarks/bench_sampling.py [--reps 5] [--tokens 64] [--build DIR]

--build DIR loads the kernel built in DIR (another checkout's build/, to compare two versions side
by side); the default is this checkout's build/.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--build", default=str(ROOT / "build"))
    args = ap.parse_args()
    os.environ["LOCAL_KERNELS"] = f"phanerozoic/det-infer={args.build}"
    from kernels import get_kernel
    from det_fixtures import real_models

    di = get_kernel("phanerozoic/det-infer", version=1)
    mm = di.MegaModel.from_pretrained(str(real_models.smollm2_checkpoint()), max_context=512)
    prompts = [[3 + (31 * b + 7 * i) % 40000 for i in range(32)] for b in range(16)]
    mm.generate(prompts[0], 4)  # warm: weights paged in, threads started
    settings = {"greedy": {}, "sampled": dict(temperature=0.8, top_p=0.9, seed=1)}
    print(f"{'batch':>5} {'mode':<8} {'tok/s':>8}")
    rates = {}
    for batch in (1, 16):
        for mode, kw in settings.items():
            times = []
            for _ in range(args.reps):
                t = time.perf_counter()
                mm.generate_batch(prompts[:batch], args.tokens, **kw)
                times.append(time.perf_counter() - t)
            rates[batch, mode] = batch * args.tokens / statistics.median(times)
            print(f"{batch:5d} {mode:<8} {rates[batch, mode]:8.1f}", flush=True)
        print(f"batch {batch}: sampled / greedy = {rates[batch, 'sampled'] / rates[batch, 'greedy']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
