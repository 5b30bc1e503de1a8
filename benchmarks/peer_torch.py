#!/usr/bin/env python3
"""A peer for benchmarks/bench_gpu.py: a stock, naive PyTorch llama decoder timed on the same GPU.

Plain torch ops (F.linear, F.scaled_dot_product_attention, elementwise RMSNorm / rope / SiLU), random bf16
weights with the shapes of bench_gpu.SHAPES, a static KV cache and greedy argmax. No fused kernels: every
norm, rope and gate is its own launch, about 40 kernels a layer, so this is a naive lower bound on what a
tuned engine (vLLM, TensorRT-LLM, gpt-fast with torch.compile) does on the same card, not a rival to it.
Columns: one decode step captured once as a CUDA graph and replayed (position is a device tensor, so one
graph serves every step), the same step eager, and eager prefill of a short and a long prompt.

    python3 benchmarks/peer_torch.py [--models SmolLM2-135M,Llama-3.2-1B] [--batches 1,16] [--steps 128]

Without CUDA (or with --device cpu) it is a dry run: the tiny shape, no graph columns ("n/a").
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_gpu import PROMPT_LEN, SHAPES, config  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=256, rope_theta=10000.0, rms_norm_eps=1e-5)
BF16 = torch.bfloat16


def shape(name):
    return dict(TINY) if name == "tiny" else config(name)


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def round_up(n, m=64):
    return (n + m - 1) // m * m


class PeerLlama:
    """Weights, rope tables and the shape; the KV cache is separate (new_cache) so one model serves each batch."""

    def __init__(self, cfg, device, max_len, scale=0.02, seed=0):
        self.H, self.I, self.L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
        self.nh, self.nkv, self.D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.V, self.eps, self.device, self.max_len = cfg["vocab_size"], cfg["rms_norm_eps"], device, max_len
        g = torch.Generator(device=device).manual_seed(seed)

        def w(*dims):  # made on the device: Llama-3.2-1B would take minutes on the host
            return (torch.randn(dims, generator=g, device=device) * scale).to(BF16)

        def norm():
            return (1.0 + w(self.H).float()).to(BF16)

        H, D = self.H, self.D
        self.embed = w(self.V, H)  # tied: the lm_head is this matrix
        self.layers = [dict(attn_norm=norm(), q=w(self.nh * D, H), k=w(self.nkv * D, H), v=w(self.nkv * D, H),
                            o=w(H, self.nh * D), mlp_norm=norm(), gate=w(self.I, H), up=w(self.I, H),
                            down=w(H, self.I)) for _ in range(self.L)]
        self.final_norm = norm()
        # Plain rope with theta; Llama-3.2's llama3 frequency scaling changes values only, not speed.
        inv_freq = 1.0 / cfg["rope_theta"] ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D)
        angles = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.cos, self.sin = angles.cos().to(BF16), angles.sin().to(BF16)  # fp32 tables cast, as transformers
        self.slots = torch.arange(max_len, device=device)

    def new_cache(self, batch):
        dims = (batch, self.nkv, self.max_len, self.D)
        return [(torch.zeros(dims, dtype=BF16, device=self.device), torch.zeros(dims, dtype=BF16, device=self.device))
                for _ in range(self.L)]


def rms_norm(x, weight, eps):
    xf = x.float()  # fp32 compute, cast back before the weight, as transformers' LlamaRMSNorm
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def repeat_kv(t, groups):
    # expand + reshape, as transformers' repeat_kv: SDPA with enable_gqa and a mask falls to the math backend
    b, kv, s, d = t.shape
    return t[:, :, None].expand(b, kv, groups, s, d).reshape(b, kv * groups, s, d)


def forward(m, cache, tokens, pos, mask=None):
    """tokens (B, T) at positions pos (T,) on the device; writes the cache; logits (B, V) of the last position.
    mask None: a prompt from slot 0, causal over its own keys; else a bool mask over all max_len cache slots."""
    B, T = tokens.shape
    x = F.embedding(tokens, m.embed)
    cos, sin = m.cos[pos], m.sin[pos]
    for lw, (kc, vc) in zip(m.layers, cache):
        h = rms_norm(x, lw["attn_norm"], m.eps)
        q = F.linear(h, lw["q"]).view(B, T, m.nh, m.D).transpose(1, 2)
        k = F.linear(h, lw["k"]).view(B, T, m.nkv, m.D).transpose(1, 2)
        v = F.linear(h, lw["v"]).view(B, T, m.nkv, m.D).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v)
        if mask is None:  # no mask: the flash backend, which takes GQA natively
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:  # the whole static cache, later slots hidden: one shape for every step
            g = m.nh // m.nkv
            a = F.scaled_dot_product_attention(q, repeat_kv(kc, g), repeat_kv(vc, g), attn_mask=mask)
        x = x + F.linear(a.transpose(1, 2).reshape(B, T, m.nh * m.D), lw["o"])
        h = rms_norm(x, lw["mlp_norm"], m.eps)
        x = x + F.linear(F.silu(F.linear(h, lw["gate"])) * F.linear(h, lw["up"]), lw["down"])
    return F.linear(rms_norm(x[:, -1], m.final_norm, m.eps), m.embed)  # only the last position's logits


def prefill(m, cache, tokens):
    return forward(m, cache, tokens, torch.arange(tokens.shape[1], device=m.device))


def decode_step(m, cache, token, pos):
    """token (B, 1), pos (1,) device tensor: logits (B, V) of that position, attending to slots <= pos."""
    return forward(m, cache, token, pos, mask=(m.slots <= pos)[None, None, None, :])


def prompts(batch, length, vocab):
    return torch.tensor([[(31 * b + 7 * i) % (vocab - 3) + 3 for i in range(length)] for b in range(batch)])


def timed(fn, device, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench(m, name, batch, args, device, prefill_lens):
    cache = m.new_cache(batch)
    row = {"model": name, "batch": batch}
    for n in prefill_lens:
        toks = prompts(batch, n, m.V).to(device)
        row[f"prefill_{n}_tok_s"] = batch * n / timed(lambda: prefill(m, cache, toks), device, args.reps)
    # Decode state lives in static tensors so a captured graph can advance it: the step feeds its own argmax back.
    start = prompts(batch, args.prompt_len, m.V).to(device)
    first = prefill(m, cache, start).argmax(-1, keepdim=True)
    token, pos = first.clone(), torch.full((1,), args.prompt_len, device=device)

    def step():
        token.copy_(decode_step(m, cache, token, pos).argmax(-1, keepdim=True))
        pos.add_(1)

    def run(fn, n):
        token.copy_(first)
        pos.fill_(args.prompt_len)
        for _ in range(n):
            fn()

    eager_n = min(args.steps, 8)
    row["eager_ms_step"] = 1e3 * timed(lambda: run(step, eager_n), device, args.reps) / eager_n
    row["graph_ms_step"] = row["graph_tok_s"] = None
    if torch.device(device).type == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the capture stream, as the CUDA-graph docs say
            run(step, 3)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        seconds = timed(lambda: run(graph.replay, args.steps), device, args.reps)
        row["graph_ms_step"], row["graph_tok_s"] = 1e3 * seconds / args.steps, batch * args.steps / seconds
    return row


def cell(key, v):
    return "n/a" if v is None else f"{v:.3f}" if key.endswith("ms_step") else f"{v:.0f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help=f"comma-separated: {', '.join(SHAPES)}, tiny "
                                                   "(default: both real shapes on CUDA, tiny on the CPU)")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=PROMPT_LEN)
    ap.add_argument("--long-prompt", type=int, default=1000, help="second prefill length; 0 leaves it out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default=None, help="write the rows here as a JSON list")
    args = ap.parse_args(argv)
    cuda = torch.device(args.device).type == "cuda"
    models = (args.models or (",".join(SHAPES) if cuda else "tiny")).split(",")
    prefill_lens = [args.prompt_len] + ([args.long_prompt] if args.long_prompt > 0 else [])
    max_len = round_up(max(prefill_lens) + args.steps + 1)
    where = torch.cuda.get_device_name(torch.device(args.device)) if cuda else "CPU (dry run)"
    print(f"{where}, torch {torch.__version__}: naive PyTorch peer, {args.steps} decode steps after a "
          f"{args.prompt_len}-token prompt, cache {max_len} slots, median of {args.reps}")
    print("| model | batch | graph ms/step | graph tok/s | eager ms/step | "
          + " | ".join(f"prefill {n} tok/s" for n in prefill_lens) + " |")
    print("|---|---|---|---|---|" + "---|" * len(prefill_lens), flush=True)
    rows = []
    with torch.inference_mode():
        for name in models:
            m = PeerLlama(shape(name), args.device, max_len)
            for batch in (int(b) for b in args.batches.split(",")):
                row = bench(m, name, batch, args, args.device, prefill_lens)
                rows.append(row)
                keys = ["graph_ms_step", "graph_tok_s", "eager_ms_step"] + [f"prefill_{n}_tok_s" for n in prefill_lens]
                print(f"| {name} | {batch} | " + " | ".join(cell(k, row[k]) for k in keys) + " |", flush=True)
            del m
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
