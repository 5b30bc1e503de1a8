#!/usr/bin/env python3
"""What seeded sampling costs on the CPU engine (docs/RESULTS.md §7): generate on SmolLM2-135M-Instruct
(bf16), greedy against sampled (temperature 0.8, top_p 0.9), one sequence and a batch of 16, medians
of --reps runs in this one process.

    .venv/bin/python benchmarks/bench_sampling.py [--reps 5] [--tokens 64] [--build DIR]
    .venv/bin/python benchmarks/bench_sampling.py --candidates [--tokens 64]

--build DIR loads the kernel built in DIR (another checkout's build/, to compare two versions side
by side); the default is this checkout's build/. --candidates counts instead, at each step of four
chat answers sampled at temperatures 1.0 and 0.7, the candidates a draw ranks: the ids whose weight
exp(fl(z - m)) is at least 2^-24 (SPEC §15; torch's float32 exp, within an ulp of the contract's),
and times the CPU engine's draw (sample_token) over the same rows of logits, medians of 3; then
logprob_rows and token_freqs over the rows of temperature 0.7, which run the same passes over the
vocabulary (z, the max, exp, the canonical sum).
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
    ap.add_argument("--candidates", action="store_true")
    args = ap.parse_args()
    os.environ["LOCAL_KERNELS"] = f"phanerozoic/det-infer={args.build}"
    from kernels import get_kernel
    from det_fixtures import real_models

    di = get_kernel("phanerozoic/det-infer", version=1)
    mm = di.MegaModel.from_pretrained(str(real_models.smollm2_checkpoint()), max_context=512)
    if args.candidates:
        return candidates(di, mm, real_models.smollm2_checkpoint(), args.tokens)
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


def candidates(di, mm, checkpoint, tokens):
    import torch
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise SystemExit("bench_sampling --candidates needs transformers (pip install transformers)")
    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    questions = ["What is the capital of France?", "Write a short poem about the sea.",
                 "Explain how a transistor works.", "List three prime numbers and explain why they are prime."]
    chats = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                     return_dict=True)["input_ids"] for q in questions]
    print(f"{'temperature':>11} {'steps':>5} {'V':>6} {'p10':>6} {'median':>7} {'p90':>6} {'max':>6} {'us/draw':>8}")
    for temperature in (1.0, 0.7):
        counts, rows = [], []
        for ids in chats:
            out = mm.generate(ids, max_new=tokens, temperature=temperature, seed=3)
            logits = mm.teacher_forced_logits(list(ids) + list(out))[len(ids) - 1:]  # each draw's row
            rows += list(logits)
            z = logits / torch.tensor(temperature, dtype=torch.float32)
            e = torch.exp(z - z.max(dim=-1, keepdim=True).values)
            counts += (e >= 2.0**-24).sum(-1).tolist()
        counts.sort()
        q = lambda f: counts[int(f * (len(counts) - 1))]  # noqa: E731
        times = []
        for _ in range(3):
            t = time.perf_counter()
            for i, row in enumerate(rows):
                di.ops.sample_token(row.contiguous(), temperature, 0, 1.0, 0.0, 7, i)
            times.append((time.perf_counter() - t) / len(rows) * 1e6)
        print(f"{temperature:11.1f} {len(counts):5d} {logits.shape[-1]:6d} {q(0.1):6d} {statistics.median(counts):7.0f} "
              f"{q(0.9):6d} {counts[-1]:6d} {statistics.median(times):8.0f}")
    rows = torch.stack(rows)  # the last temperature's rows: the passes over the vocabulary that scoring and
    n = rows.shape[0]         # compression share with the draw (z, the max, exp, the canonical sum)
    lp, rank = torch.empty(n), torch.empty(n, dtype=torch.int64)
    freqs = torch.empty(rows.shape, dtype=torch.int32)
    for name, op in (("logprob_rows", lambda: di.ops.logprob_rows(rows, torch.zeros(n, dtype=torch.int64), 1.0, 0, lp,
                                                                   rank, torch.empty(n, 0, dtype=torch.int64),
                                                                   torch.empty(n, 0))),
                     ("token_freqs", lambda: di.ops.token_freqs(rows, freqs))):
        times = []
        for _ in range(3):
            t = time.perf_counter()
            op()
            times.append((time.perf_counter() - t) / n * 1e6)
        print(f"{name}: {statistics.median(times):.0f} us a row (wall time over the engine's threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
