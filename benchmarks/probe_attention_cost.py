#!/usr/bin/env python3
"""Is the CPU engine's attention bound by arithmetic or by memory? One thread, synthetic models with
SmolLM2-135M's attention shape (9 query heads, 3 KV heads, head 64, width 576) and 1, 8 or 30
layers: decode at position 50 and at --positions, and the extra time per (cached key, query head).
A cost that stays the same while the KV cache grows from in-cache (1 layer) to far past L3 (30
layers) means the arithmetic sets it (issue 51's note, 2026-12-05: 27.5 / 37.6 / 23.2 ns).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/probe_attention_cost.py [--positions 2000]
"""
import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    from det_fixtures import synthetic
    from kernels import get_kernel

    di = get_kernel("phanerozoic/det-infer", version=1)
    P = args.positions
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (1, 8, 30):
            d = synthetic.write_checkpoint("llama", os.path.join(tmp, f"l{layers}"), seed=1, num_hidden_layers=layers,
                                           hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                                           intermediate_size=1536, vocab_size=1000, max_position_embeddings=P + 64,
                                           tie_word_embeddings=True)
            mm = di.MegaModel.from_pretrained(d, max_context=P + args.reps + 8)
            ids = synthetic.token_sequence(P + args.reps + 4, 1000, 3)
            ms = {}
            for p in (50, P):
                st = mm.new_state(p + args.reps + 2)
                mm.prefill(ids[:p], st)
                ts = []
                for r in range(args.reps):
                    t = time.perf_counter()
                    mm.decode_step(ids[p + r], p + r, st)
                    ts.append(time.perf_counter() - t)
                ms[p] = statistics.median(ts) * 1e3
            per = (ms[P] - ms[50]) * 1e6 / ((P - 50) * layers * 9)
            print(f"{layers} layers: KV cache {layers * 3 * 64 * 2 * 4 * P / 1e6:.0f} MB at {P}; decode "
                  f"{ms[50]:.2f} -> {ms[P]:.2f} ms; {per:.1f} ns per (key, query head)", flush=True)


if __name__ == "__main__":
    main()
