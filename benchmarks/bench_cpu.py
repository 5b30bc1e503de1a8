#!/usr/bin/env python3
"""CPU throughput of det-infer on SmolLM2-135M-Instruct (bf16, and its nf4 quantization kept
packed), side by side with transformers eager (fp32 and bf16), llama.cpp (bf16 GGUF of the same
checkpoint, if benchmarks/build_llamacpp.sh has built it: its native build, and a build without
bf16 dot products that multiplies in fp32 fma; both round the activations to bf16, which det-infer
does not) and the memory-bandwidth floor. Prints the markdown table of docs/RESULTS.md §5.

    .venv/bin/python benchmarks/bench_cpu.py [--threads 2] [--reps 3] [--engines det-infer,det-infer-nf4]
    .venv/bin/python benchmarks/bench_cpu.py --model gemma3 --engines det-infer   # Gemma-3-270M (gelu-tanh)

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
BATCH_PROMPT_LEN, BATCH_STEPS = 32, DECODE_STEPS // 4  # each sequence of the batch figure: its prompt, its steps


def _checkpoint(model, kind):
    """The checkpoint an engine runs: SmolLM2-135M-Instruct (bf16, or its nf4 quantization), or the
    bf16 Gemma-3-270M."""
    from det_fixtures import real_models
    if model == "gemma3":
        if kind == "det-infer-nf4":
            raise SystemExit("bench_cpu: --model gemma3 has no nf4 checkpoint; use --engines det-infer,transformers-...")
        return real_models.gemma3_checkpoint()
    return real_models.smollm2_nf4_checkpoint() if kind == "det-infer-nf4" else real_models.smollm2_checkpoint()


def _child(kind, threads, model):
    """Runs one engine in this process and prints a JSON line of its numbers."""
    import torch

    torch.set_num_threads(threads)
    ckpt = _checkpoint(model, kind)
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
        states = [mm.new_state(BATCH_PROMPT_LEN + BATCH_STEPS) for _ in range(BATCH)]
        for s in states:
            mm.extend(ids[:BATCH_PROMPT_LEN], s)
        t = time.perf_counter()
        for _ in range(BATCH_STEPS):
            mm.decode_batch([5] * BATCH, [s.length for s in states], states)
        out["decode_b16"] = BATCH * BATCH_STEPS / (time.perf_counter() - t)
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
            xb = torch.tensor([ids[:BATCH_PROMPT_LEN]] * BATCH)
            o = model(xb, use_cache=True)
            cache, tok = o.past_key_values, torch.full((BATCH, 1), 5)
            t = time.perf_counter()
            for _ in range(BATCH_STEPS):
                cache = model(tok, past_key_values=cache, use_cache=True).past_key_values
            out["decode_b16"] = BATCH * BATCH_STEPS / (time.perf_counter() - t)
    out["peak_rss_mb"] = _peak_mb()
    print(json.dumps(out))


def _status_mb(field):
    """A field of /proc/self/status in MB. VmHWM is this process's own peak: getrusage's ru_maxrss
    is not, as Linux carries the parent's peak into a child across fork and exec (so a parent that
    had just converted a checkpoint made every engine read the same 1444 MB)."""
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def _rss_mb():
    return _status_mb("VmRSS")


def _peak_mb():
    return _status_mb("VmHWM")


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


LLAMACPP_BUILDS = {  # benchmarks/build_llamacpp.sh builds both
    "build": "llama.cpp bf16",
    "build-fp32": "llama.cpp bf16, fp32 fma (built without AVX512-BF16)",  # only on AVX-512 CPUs
}


def llamacpp(threads, ckpt, reps, build):
    """llama.cpp on a bf16 GGUF converted from the same checkpoint, or None if `build` is not built:
    llama-bench's prefill, decode after the prompt's positions (-d) and decode from position 0; and
    llama-batched-bench's decode of 1 and of BATCH sequences, each after its own prompt of
    BATCH_PROMPT_LEN tokens as in det-infer's batch-16 figure (DECODE_STEPS steps: a shorter run
    leaves batch 1 too noisy to divide by), as medians of `reps` runs."""
    bin_dir = ROOT / "build/llamacpp" / build / "bin"
    if not (bin_dir / "llama-bench").exists():
        return None
    gguf = ROOT / "build/llamacpp/smollm2-135m-instruct-bf16.gguf"
    if not gguf.exists():
        convert = next((ROOT / "build/llamacpp").glob("llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
        env = dict(os.environ, PYTHONPATH=str(ROOT / "build/llamacpp/pydeps"))
        subprocess.run([sys.executable, str(convert), str(ckpt), "--outtype", "bf16", "--outfile", str(gguf)],
                       check=True, capture_output=True, env=env)
    def bench(*flags):
        r = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-r", str(reps),
                            "-o", "json", *flags], check=True, capture_output=True, text=True)
        return json.loads(r.stdout)

    rows = bench("-p", str(PROMPT_LEN), "-n", str(DECODE_STEPS))
    out = {"prefill": next(x["avg_ts"] for x in rows if x["n_prompt"] > 0),
           "decode0": next(x["avg_ts"] for x in rows if x["n_gen"] > 0),
           # decode after the prompt's positions, as det-infer's decode figures are measured
           "decode": bench("-p", "0", "-n", str(DECODE_STEPS), "-d", str(PROMPT_LEN))[0]["avg_ts"]}
    batched = bin_dir / "llama-batched-bench"
    if batched.exists():
        runs = []
        for _ in range(reps):
            r = subprocess.run([str(batched), "-m", str(gguf), "-t", str(threads), "-c", "4096", "-npp", str(BATCH_PROMPT_LEN),
                                "-ntg", str(DECODE_STEPS), "-npl", f"1,{BATCH}", "--output-format", "jsonl"],
                               check=True, capture_output=True, text=True)
            rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
            runs.append({x["pl"]: x["speed_tg"] for x in rows})
        out["b1"] = statistics.median(r[1] for r in runs)
        out["b16"] = statistics.median(r[BATCH] for r in runs)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--child")
    ap.add_argument("--engines", default="det-infer,det-infer-nf4,transformers-fp32,transformers-bf16")
    ap.add_argument("--model", choices=("smollm2", "gemma3"), default="smollm2",
                    help="gemma3: Gemma-3-270M, without llama.cpp (its GGUF is built from SmolLM2)")
    args = ap.parse_args()
    if args.child:
        return _child(args.child, args.threads, args.model)
    ckpt = _checkpoint(args.model, "det-infer")
    weight_bytes = os.path.getsize(ckpt / "model.safetensors")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    results = {}
    for kind in args.engines.split(","):
        runs = []
        for _ in range(args.reps):
            r = subprocess.run([sys.executable, __file__, "--child", kind, "--threads", str(args.threads),
                                "--model", args.model],
                               env=env, check=True, capture_output=True, text=True)
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        results[kind] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    bw = read_bandwidth(args.threads)
    lcs = {name: llamacpp(args.threads, ckpt, args.reps, build)
           for build, name in LLAMACPP_BUILDS.items() if args.model == "smollm2"}
    lcs = {name: r for name, r in lcs.items() if r}
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"{time.strftime('%Y-%m-%d')}, {cpu}, {args.threads} threads; {ckpt.name}; medians of {args.reps} runs; "
          f"prompt {PROMPT_LEN}, {DECODE_STEPS} decode steps, batch {BATCH}")
    print("| engine | prefill tok/s | decode b1 tok/s (per-step calls) | decode b1 tok/s (single launch) "
          "| decode b16 tok/s (aggregate) | b16 / b1 | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for kind, r in results.items():
        single = f"{r['decode_b1_single_launch']:.1f}" if "decode_b1_single_launch" in r else ""
        print(f"| {kind} | {r['prefill']:.0f} | {r['decode_b1']:.1f} | {single} | {r['decode_b16']:.1f} | "
              f"{r['decode_b16'] / r['decode_b1']:.1f}x | {r['peak_rss_mb']:.0f} |")
    for name, lc in lcs.items():
        b16 = f"{lc['b16']:.1f} | {lc['b16'] / lc['b1']:.1f}x" if "b16" in lc else " | "
        print(f"| {name} (llama-bench -t {args.threads}; decode after {PROMPT_LEN} positions, -d {PROMPT_LEN}; "
              f"b16 and its b1 divisor: llama-batched-bench, {DECODE_STEPS} steps after {BATCH_PROMPT_LEN}-token prompts) | "
              f"{lc['prefill']:.0f} | | {lc['decode']:.1f} | {b16} | |")
        print(f"| {name}, decode from position 0 (llama-bench's default) | | | {lc['decode0']:.1f} | | | |")
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
    for name, lc in lcs.items():
        print(f"det-infer / {name}: decode b1 {d['decode_b1'] / lc['decode']:.2f}x per-step calls, "
              f"{d['decode_b1_single_launch'] / lc['decode']:.2f}x single launch; prefill "
              f"{d['prefill'] / lc['prefill']:.2f}x" + (f"; decode b16 {d['decode_b16'] / lc['b16']:.2f}x" if "b16" in lc else ""))
    print(f"det-infer's b16 / b1 divides its batch of {BATCH} ({BATCH_STEPS} steps after {BATCH_PROMPT_LEN}-token prompts) "
          f"by its batch-1 decode at positions {PROMPT_LEN}..{PROMPT_LEN + DECODE_STEPS - 1}")
    print(f"det-infer memory above the process baseline (torch imported): peak {d['engine_mb']:.0f} MB, "
          f"budget (weights + its KV caches + 50 MB) {d['budget_mb']:.0f} MB")


if __name__ == "__main__":
    sys.exit(main())
