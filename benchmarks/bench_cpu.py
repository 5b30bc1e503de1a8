#!/usr/bin/env python3
"""CPU throughput of det-infer on SmolLM2-135M-Instruct (bf16, and its nf4 quantization kept
packed), side by side with transformers eager (fp32 and bf16), llama.cpp (bf16 GGUF of the same
checkpoint, if benchmarks/build_llamacpp.sh has built it) and the memory-bandwidth floor. Prints
the markdown table of docs/RESULTS.md §5.

    .venv/bin/python benchmarks/bench_cpu.py [--threads 2] [--reps 3] [--engines det-infer,det-infer-nf4]

Each engine runs in its own process (so peak RSS is its own); every figure is the median of
--reps runs measured in this one invocation. Prefill is timed after one warm-up pass (llama-bench
warms up too), and decode runs at positions PROMPT_LEN .. PROMPT_LEN + DECODE_STEPS - 1 for every
engine: llama-bench's decode is taken at that depth (-d PROMPT_LEN), its default from position 0
is printed beside it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT_LEN, DECODE_STEPS, BATCH = 128, 64, 16


def _child(kind, threads):
    """Runs one engine in this process and prints a JSON line of its numbers."""
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(ROOT / "tests"))
    import real_models

    ckpt = real_models.smollm2_nf4_checkpoint() if kind == "det-infer-nf4" else real_models.smollm2_checkpoint()
    ids = [(17 * i + 3) % 40000 + 100 for i in range(PROMPT_LEN)]
    out = {}
    if kind.startswith("det-infer"):
        os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
        from kernels import get_kernel

        di = get_kernel("phanerozoic/det-infer", version=1)
        base = _rss_mb()
        mm = di.MegaModel.from_pretrained(ckpt, max_context=1024)
        st = mm.new_state(PROMPT_LEN + DECODE_STEPS)
        mm.extend(ids, st)  # a warm-up pass (first touch of the mapped weights), as llama-bench's
        st.reset()
        t = time.perf_counter()
        mm.extend(ids, st)
        out["prefill"] = PROMPT_LEN / (time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(DECODE_STEPS):
            mm.decode_step(5, st.length, st)
        out["decode_b1"] = DECODE_STEPS / (time.perf_counter() - t)
        # The single-launch path: one native call for the prompt and every step; the decode rate is
        # the difference between DECODE_STEPS + 1 new tokens and 1 new token (the prefill).
        t = time.perf_counter()
        mm.generate(ids, max_new=1)
        t1 = time.perf_counter()
        mm.generate(ids, max_new=DECODE_STEPS + 1)
        t2 = time.perf_counter()
        out["decode_b1_single_launch"] = DECODE_STEPS / ((t2 - t1) - (t1 - t))
        states = [mm.new_state(32 + DECODE_STEPS // 4) for _ in range(BATCH)]
        for s in states:
            mm.extend(ids[:32], s)
        t = time.perf_counter()
        for _ in range(DECODE_STEPS // 4):
            mm.decode_batch([5] * BATCH, [s.length for s in states], states)
        out["decode_b16"] = BATCH * (DECODE_STEPS // 4) / (time.perf_counter() - t)
        kv_mb = (st.cache.numel() + sum(s.cache.numel() for s in states)) * 4 / 2**20
        out["engine_mb"] = _peak_mb() - base
        held = sum(t.numel() * t.element_size() for t in mm._weights + mm._scales)
        out["budget_mb"] = held / 2**20 + kv_mb + 50
        out["weight_mb"] = held / 2**20
        packed = [(w, a) for w, a in zip(mm._weights, mm._scales) if a.numel()]
        if packed:  # bytes per parameter of the nf4 projections: codes plus the resolved absmax
            out["nf4_bytes_per_param"] = sum(w.numel() + 4 * a.numel() for w, a in packed) / \
                sum(2 * w.numel() for w, _ in packed)
    else:
        import transformers

        dtype = torch.float32 if kind == "transformers-fp32" else torch.bfloat16
        model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=dtype).eval()
        x = torch.tensor([ids])
        with torch.no_grad():
            model(x, use_cache=True)  # warm-up pass
            t = time.perf_counter()
            o = model(x, use_cache=True)
            out["prefill"] = PROMPT_LEN / (time.perf_counter() - t)
            cache, tok = o.past_key_values, torch.tensor([[5]])
            t = time.perf_counter()
            for _ in range(DECODE_STEPS):
                cache = model(tok, past_key_values=cache, use_cache=True).past_key_values
            out["decode_b1"] = DECODE_STEPS / (time.perf_counter() - t)
            xb = torch.tensor([ids[:32]] * BATCH)
            o = model(xb, use_cache=True)
            cache, tok = o.past_key_values, torch.full((BATCH, 1), 5)
            t = time.perf_counter()
            for _ in range(DECODE_STEPS // 4):
                cache = model(tok, past_key_values=cache, use_cache=True).past_key_values
            out["decode_b16"] = BATCH * (DECODE_STEPS // 4) / (time.perf_counter() - t)
    out["peak_rss_mb"] = _peak_mb()
    print(json.dumps(out))


def _rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def read_bandwidth(threads):
    """GB/s of a multi-threaded sum over 1 GiB (median of 5): the memory read rate the floor uses."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(1 << 28, dtype=torch.float32)
    x.sum()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t)
    return x.numel() * 4 / statistics.median(times) / 1e9


def llamacpp(threads, ckpt):
    """llama-bench on a bf16 GGUF converted from the same checkpoint: tok/s of (prefill, decode after
    the prompt's positions, decode from position 0)."""
    bench = ROOT / "build/llamacpp/build/bin/llama-bench"
    if not bench.exists():
        return None
    gguf = ROOT / "build/llamacpp/smollm2-135m-instruct-bf16.gguf"
    if not gguf.exists():
        convert = next((ROOT / "build/llamacpp").glob("llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
        env = dict(os.environ, PYTHONPATH=str(ROOT / "build/llamacpp/pydeps"))
        subprocess.run([sys.executable, str(convert), str(ckpt), "--outtype", "bf16", "--outfile", str(gguf)],
                       check=True, capture_output=True, env=env)
    def run(*flags):
        r = subprocess.run([str(bench), "-m", str(gguf), "-t", str(threads), "-r", "3", "-o", "json", *flags],
                           check=True, capture_output=True, text=True)
        return json.loads(r.stdout)

    rows = run("-p", str(PROMPT_LEN), "-n", str(DECODE_STEPS))
    pp = next(x["avg_ts"] for x in rows if x["n_prompt"] > 0)
    tg0 = next(x["avg_ts"] for x in rows if x["n_gen"] > 0)
    # decode after the prompt's positions, as det-infer's decode figures are measured
    tg = run("-p", "0", "-n", str(DECODE_STEPS), "-d", str(PROMPT_LEN))[0]["avg_ts"]
    return pp, tg, tg0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--child")
    ap.add_argument("--engines", default="det-infer,det-infer-nf4,transformers-fp32,transformers-bf16")
    args = ap.parse_args()
    if args.child:
        return _child(args.child, args.threads)
    sys.path.insert(0, str(ROOT / "tests"))
    import real_models

    ckpt = real_models.smollm2_checkpoint()
    weight_bytes = os.path.getsize(ckpt / "model.safetensors")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    results = {}
    for kind in args.engines.split(","):
        runs = []
        for _ in range(args.reps):
            r = subprocess.run([sys.executable, __file__, "--child", kind, "--threads", str(args.threads)],
                               env=env, check=True, capture_output=True, text=True)
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        results[kind] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    bw = read_bandwidth(args.threads)
    lc = llamacpp(args.threads, ckpt)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"{time.strftime('%Y-%m-%d')}, {cpu}, {args.threads} threads; medians of {args.reps} runs; "
          f"prompt {PROMPT_LEN}, {DECODE_STEPS} decode steps, batch {BATCH}")
    print("| engine | prefill tok/s | decode b1 tok/s (per-step calls) | decode b1 tok/s (single launch) "
          "| decode b16 tok/s (aggregate) | b16 / b1 | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for kind, r in results.items():
        single = f"{r['decode_b1_single_launch']:.1f}" if "decode_b1_single_launch" in r else ""
        print(f"| {kind} | {r['prefill']:.0f} | {r['decode_b1']:.1f} | {single} | {r['decode_b16']:.1f} | "
              f"{r['decode_b16'] / r['decode_b1']:.1f}x | {r['peak_rss_mb']:.0f} |")
    if lc:
        print(f"| llama.cpp bf16 (llama-bench -t {args.threads}; decode after {PROMPT_LEN} positions, -d "
              f"{PROMPT_LEN}) | {lc[0]:.0f} | | {lc[1]:.1f} | | | |")
        print(f"| llama.cpp bf16, decode from position 0 (llama-bench's default) | | | {lc[2]:.1f} | | | |")
    print(f"| bandwidth floor ({weight_bytes / 1e6:.0f} MB of bf16 weights at {bw:.1f} GB/s read) | | | "
          f"{bw * 1e9 / weight_bytes:.1f} | | | |")
    if "det-infer-nf4" in results:
        nf4_bytes = results["det-infer-nf4"]["weight_mb"] * 2**20
        print(f"| bandwidth floor, nf4 ({nf4_bytes / 1e6:.0f} MB held: packed projections, bf16 embedding) | | | "
              f"{bw * 1e9 / nf4_bytes:.1f} | | | |")
    d = results["det-infer"]
    if "transformers-bf16" in results:
        print(f"\ndet-infer / transformers-bf16 decode b1: "
              f"{d['decode_b1'] / results['transformers-bf16']['decode_b1']:.1f}x")
    if "det-infer-nf4" in results:
        q = results["det-infer-nf4"]
        print(f"det-infer nf4 / bf16: decode b1 {q['decode_b1'] / d['decode_b1']:.2f}x per-step calls, "
              f"{q['decode_b1_single_launch'] / d['decode_b1_single_launch']:.2f}x single launch, b16 "
              f"{q['decode_b16'] / d['decode_b16']:.2f}x, prefill {q['prefill'] / d['prefill']:.2f}x; weights held "
              f"{q['weight_mb']:.0f} MB vs {d['weight_mb']:.0f} MB, {q['nf4_bytes_per_param']:.4f} bytes per nf4 "
              f"parameter; memory above baseline {q['engine_mb']:.0f} MB (budget {q['budget_mb']:.0f} MB)")
    if lc:
        print(f"det-infer / llama.cpp: decode b1 {d['decode_b1'] / lc[1]:.2f}x per-step calls, "
              f"{d['decode_b1_single_launch'] / lc[1]:.2f}x single launch; prefill {d['prefill'] / lc[0]:.2f}x")
    print(f"det-infer memory above the process baseline (torch imported): peak {d['engine_mb']:.0f} MB, "
          f"budget (weights + its KV caches + 50 MB) {d['budget_mb']:.0f} MB")


if __name__ == "__main__":
    sys.exit(main())
