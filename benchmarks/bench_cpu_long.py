#!/usr/bin/env python3
"""The CPU engine at long contexts beside llama.cpp (issue 51): decode tokens/s at each position,
prefill tokens/s of a prompt, KV memory against its formula, and an SVG plot of decode against the
context. SmolLM2-135M-Instruct bf16; its config's position limit (8,192) is raised in a copy of the
checkpoint (config.json only; the weights are linked) so that positions past it can run.

Decode at position P: a state whose first P positions hold seeded random K and V (decode's cost does
not depend on the values; a real prefill to 32,768 positions would take about ten minutes here), then
`decode_step` medians of --rounds x --reps steps, the positions taken in turn each round. Prefill: a
real `prefill` of --prefill tokens into a fresh state. llama.cpp (benchmarks/build_llamacpp.sh's
fp32-fma build, if built): `llama-bench -p 0 -n 32 -d P` at each position up to --llamacpp-max, and
`-p PREFILL -n 0`, same threads, once before det-infer's runs and once after; its figures are the
mean of the two, so that a slow spell of this shared host during one side does not decide a ratio
(both runs are printed).

    .venv/bin/python benchmarks/bench_cpu_long.py [--positions 50,1008,4000,32768] [--prefill 4000]
        [--reps 10] [--rounds 3] [--threads 2] [--svg docs/long_context.svg]
"""
import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / "build/llamacpp/build-fp32/bin/llama-bench"
GGUF = ROOT / "build/llamacpp/smollm2-135m-instruct-bf16.gguf"


def raised_limit(ckpt, positions):
    """A copy of the checkpoint directory whose config allows `positions`: config.json rewritten,
    every other file linked."""
    d = Path(tempfile.mkdtemp(prefix="det-long-"))
    for f in Path(ckpt).iterdir():
        (d / f.name).symlink_to(f)
    cfg = json.loads((Path(ckpt) / "config.json").read_text())
    cfg["max_position_embeddings"] = max(cfg["max_position_embeddings"], positions)
    (d / "config.json").unlink()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def llamacpp(args, depths):
    """llama-bench's decode tok/s at each depth and its prefill tok/s, or {} when not built."""
    if not LLAMA.exists() or not GGUF.exists():
        return {}
    out = {}
    base = [str(LLAMA), "-m", str(GGUF), "-t", str(args.threads), "-o", "json"]
    if depths:
        r = subprocess.run(base + ["-p", "0", "-n", "32", "-r", "3", "-d", ",".join(map(str, depths))],
                           capture_output=True, text=True, check=True)
        for row in json.loads(r.stdout):
            out[("decode", row["n_depth"])] = row["avg_ts"]
    if args.prefill:
        r = subprocess.run(base + ["-p", str(args.prefill), "-n", "0", "-r", "2"], capture_output=True, text=True,
                           check=True)
        out[("prefill", args.prefill)] = json.loads(r.stdout)[0]["avg_ts"]
    return out


def svg_plot(path, series, title):
    """A small line chart of decode tok/s (y) against the position (x, log scale), stdlib only."""
    import math
    W, H, L, B, T, R = 640, 360, 60, 40, 30, 150
    xs = sorted({x for pts in series.values() for x in pts})
    ymax = max(y for pts in series.values() for y in pts.values()) * 1.1
    lx0, lx1 = math.log10(min(xs)), math.log10(max(xs))
    sx = lambda x: L + (math.log10(x) - lx0) / (lx1 - lx0 or 1) * (W - L - R)
    sy = lambda y: H - B - y / ymax * (H - B - T)
    el = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
          f'<rect width="{W}" height="{H}" fill="white"/>',
          f'<text x="{W / 2 - 60}" y="18">{title}</text>',
          f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
          f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
          f'<text x="{(W - R) / 2}" y="{H - 8}">position (log scale)</text>',
          f'<text x="8" y="{T - 8}">decode tok/s</text>']
    for x in xs:
        el.append(f'<text x="{sx(x) - 14:.0f}" y="{H - B + 16}">{x:,}</text>')
    step = 10 if ymax < 120 else 20
    for y in range(0, int(ymax) + 1, step):
        el.append(f'<text x="{L - 30}" y="{sy(y) + 4:.0f}">{y}</text>')
        el.append(f'<line x1="{L}" y1="{sy(y):.0f}" x2="{W - R}" y2="{sy(y):.0f}" stroke="#ddd"/>')
    colors = ["#1f77b4", "#d62728", "#2ca02c"]
    for i, (name, pts) in enumerate(series.items()):
        c = colors[i % len(colors)]
        p = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(pts.items()))
        el.append(f'<polyline points="{p}" fill="none" stroke="{c}" stroke-width="2"/>')
        for x, y in pts.items():
            el.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{c}"/>')
        el.append(f'<text x="{W - R + 10}" y="{T + 20 + 18 * i}" fill="{c}">{name}</text>')
    el.append("</svg>")
    Path(path).write_text("\n".join(el) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", default="50,1008,4000,32768")
    ap.add_argument("--prefill", type=int, default=4000, help="prompt length to prefill (0: none)")
    ap.add_argument("--reps", type=int, default=10, help="decode steps per position per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over the positions (medians of all steps)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llamacpp-max", type=int, default=8192, help="deepest llama.cpp decode point")
    ap.add_argument("--svg", help="write the decode plot here")
    args = ap.parse_args()
    positions = [int(p) for p in args.positions.split(",")]
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    import torch
    from det_fixtures import real_models
    from kernels import get_kernel

    di = get_kernel("phanerozoic/det-infer", version=1)
    top = max(positions + [args.prefill]) + args.rounds * args.reps + 8
    ckpt = raised_limit(real_models.smollm2_checkpoint(), top)
    try:
        mm = di.MegaModel.from_pretrained(str(ckpt), max_context=top)
    finally:
        shutil.rmtree(ckpt)
    cfg = mm.config
    vocab = cfg.vocab_size
    kv_width = cfg.num_key_value_heads * cfg.head_dim
    llama_depths = [p for p in positions if p <= args.llamacpp_max]
    peer_before = llamacpp(args, llama_depths)
    warm = mm.new_state(64)
    mm.prefill([3 + i for i in range(32)], warm)
    base_rss = rss_mb()
    print(f"CPU engine, SmolLM2-135M-Instruct bf16, {args.threads} threads, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    # Every position's state first, then --rounds rounds over the positions, --reps steps each: a
    # slow spell of the shared host lands on every position alike, not on one.
    states, steps = {}, {pos: [] for pos in positions}
    for pos in positions:
        st = mm.new_state(pos + args.rounds * args.reps + 2)
        st.cache[:, :pos].normal_(generator=torch.Generator().manual_seed(pos))  # K and V of 0 .. pos - 1
        st.length = pos
        states[pos] = st
    grew = rss_mb() - base_rss
    for r in range(args.rounds):
        for pos in positions:
            steps[pos] += [mm.decode_step_timed(5, pos + r * args.reps + i, states[pos])[1] for i in range(args.reps)]
    ours, rows = {}, []
    for pos in positions:
        ms = 1e3 * statistics.median(steps[pos])
        ours[pos] = 1e3 / ms
        measured = states[pos].cache.numel() * 4 / 2**20
        formula = cfg.num_hidden_layers * 2 * states[pos].capacity * kv_width * 4 / 2**20
        rows.append((pos, ms, measured, formula))
    states.clear()
    prefill_tps = None
    if args.prefill:
        st = mm.new_state(args.prefill + 2)
        ids = [(7 * i + 3) % (vocab - 3) + 3 for i in range(args.prefill)]
        t = time.perf_counter()
        mm.prefill(ids, st)
        prefill_tps = args.prefill / (time.perf_counter() - t)
    peer_after = llamacpp(args, llama_depths)
    peer = {key: (peer_before[key] + peer_after[key]) / 2 for key in peer_before if key in peer_after}
    if peer:
        print("llama.cpp before / after det-infer: " + "; ".join(
            f"{kind} {depth:,}: {peer_before[(kind, depth)]:.1f} / {peer_after[(kind, depth)]:.1f}"
            for kind, depth in sorted(peer)))
    print("| position | det-infer decode ms | tok/s | llama.cpp fp32-fma tok/s (before, after: mean) | ratio | KV MiB: state / formula |")
    print("|---|---|---|---|---|---|")
    for pos, ms, measured, formula in rows:
        lc = peer.get(("decode", pos))
        lcs = f"{lc:.1f} | {1e3 / ms / lc:.2f}" if lc else "- | -"
        print(f"| {pos:,} | {ms:.2f} | {1e3 / ms:.1f} | {lcs} | {measured:,.1f} / {formula:,.1f} |")
    total = sum(m for _, _, m, _ in rows)
    print(f"\nall states together: {total:,.0f} MiB by the formula; the process's peak RSS grew {grew:,.0f} MiB")
    if prefill_tps:
        lc = peer.get(("prefill", args.prefill))
        tail = f"; llama.cpp {lc:.0f} tok/s, ratio {prefill_tps / lc:.2f}" if lc else ""
        print(f"\nprefill of {args.prefill:,} tokens: {prefill_tps:.0f} tok/s ({args.prefill / prefill_tps:.1f} s){tail}")
    if len(positions) > 1 and 4000 in ours and max(positions) > 4000:
        print(f"decode at {max(positions):,} vs 4,000: {ours[4000] / ours[max(positions)]:.2f}x slower")
    if args.svg:
        series = {"det-infer": ours}
        lc = {p: peer[("decode", p)] for p in positions if ("decode", p) in peer}
        if lc:
            series["llama.cpp fp32-fma"] = lc
        svg_plot(args.svg, series, f"SmolLM2-135M decode, {args.threads} threads")
        print(f"plot: {args.svg}")


if __name__ == "__main__":
    main()
