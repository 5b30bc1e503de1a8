#!/usr/bin/env python3
"""The CPU engine's decode against the context: SmolLM2-135M-Instruct (bf16), one decode step at
positions ~50, ~1,000 and ~4,000 (the state prefilled to that position first), medians of --reps
steps, beside the GPU model's prediction for the H200 (benchmarks/gpu_model.py, geometry attn 0 and
32), so a user can tell which to pick for long contexts (docs/RESULTS.md §9).

    .venv/bin/python benchmarks/bench_cpu_context.py [--positions 50,1000,4000] [--reps 20] [--threads 2]
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", default="50,1000,4000")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    positions = [int(p) for p in args.positions.split(",")]
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from kernels import get_kernel
    from det_fixtures import real_models

    import gpu_model

    di = get_kernel("phanerozoic/det-infer", version=1)
    mm = di.MegaModel.from_pretrained(str(real_models.smollm2_checkpoint()), max_context=max(positions) + args.reps + 8)
    vocab = mm.config.vocab_size
    c, constants = gpu_model.fitted("h200")
    warm = mm.new_state(64)  # the memory-mapped weights paged in, the threads started
    mm.prefill([3 + i for i in range(32)], warm)
    for i in range(8):
        mm.decode_step(5, 32 + i, warm)
    print(f"CPU engine, SmolLM2-135M-Instruct bf16, {args.threads} threads; decode_step medians of {args.reps}")
    print("| position | prefill s | CPU decode ms | CPU tok/s | H200 predicted tok/s, attn 0 | attn 32 |")
    print("|---|---|---|---|---|---|")
    for pos in positions:
        state = mm.new_state(pos + args.reps + 2)
        ids = [(7 * i + 3) % (vocab - 3) + 3 for i in range(pos)]
        t = time.perf_counter()
        mm.prefill(ids, state)
        prefill_s = time.perf_counter() - t
        times = [mm.decode_step_timed(5, pos + i, state)[1] for i in range(args.reps)]
        ms = 1e3 * statistics.median(times)
        g0 = gpu_model.predict(c, constants, "SmolLM2-135M", 1, pos + args.reps // 2)[1]
        g32 = gpu_model.predict(c, constants, "SmolLM2-135M", 1, pos + args.reps // 2, geometry={"attn": 32})[1]
        print(f"| {pos:,} | {prefill_s:.1f} | {ms:.2f} | {1e3 / ms:.1f} | {g0:,.0f} | {g32:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
