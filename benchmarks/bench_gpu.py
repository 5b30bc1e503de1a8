#!/usr/bin/env python3
"""GPU decode throughput of the megakernel (scripts/device_check.sh runs it on a lent GPU; docs/
RESULTS.md §9 records the table). Models with the shapes of SmolLM2-135M and Llama-3.2-1B and
random bf16 weights made on the device (speed does not depend on the values; the real checkpoints are
not carried to the device machine). For each: decode tokens/s at batch 1 and 16 (generate_batch: one
launch runs the prompt and every step; tokens/s = batch x steps / seconds of the whole call), the
device time of one decode_step, and the weight-bandwidth floor (weight bytes per token over a
device-to-device copy bandwidth measured in the same run). Medians of --reps runs.

    LOCAL_KERNELS=phanerozoic/det-infer=$PWD/build python3 benchmarks/bench_gpu.py [--steps 128] [--reps 3]
"""
import argparse
import statistics
import time

import torch

SHAPES = {
    "SmolLM2-135M": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, vocab_size=49152, rope_theta=100000.0,
                         max_position_embeddings=8192),
    "Llama-3.2-1B": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                         rope_theta=500000.0),
}
PROMPT_LEN = 16


def config(shape):
    return dict(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5, tie_word_embeddings=True,
                hidden_act="silu", bos_token_id=1, eos_token_id=2, **shape)


def random_weights(di, cfg, device):
    g = torch.Generator(device=device).manual_seed(0)
    out = {}
    for name in di.names.llama_tensor_names(cfg):
        shape = _shape(cfg, name)
        t = torch.randn(shape, generator=g, device=device, dtype=torch.float32) * (1.0 if "norm" in name else 0.02)
        out[name] = (t + (1.0 if "norm" in name else 0.0)).to(torch.bfloat16)
    return out


def _shape(cfg, name):
    H, D, I, V = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    QD, KVD = cfg.num_attention_heads * D, cfg.num_key_value_heads * D
    for key, shape in (("embed_tokens", (V, H)), ("q_proj", (QD, H)), ("k_proj", (KVD, H)), ("v_proj", (KVD, H)),
                       ("o_proj", (H, QD)), ("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I)),
                       ("lm_head", (V, H))):
        if key in name:
            return shape
    return (H,)


def copy_bandwidth(device):
    """Bytes per second of a device-to-device copy of 1 GiB (read + write counted)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return 2 * a.numel() / statistics.median(times)


def bench(di, name, steps, reps, device):
    cfg = di.ModelConfig.from_dict(config(SHAPES[name]))
    mm = di.MegaModel(cfg, random_weights(di, cfg, device), device=device, max_context=PROMPT_LEN + steps + 1)
    weight_bytes = sum(w.numel() * w.element_size() for w in mm._weights)
    row = {"model": name, "weights_gb": weight_bytes / 1e9, "geometry": None}
    for batch in (1, 16):
        prompts = [[(31 * b + 7 * i) % 1000 + 3 for i in range(PROMPT_LEN)] for b in range(batch)]
        mm.generate_batch(prompts, max_new=4)  # warm-up (module load, first launch)
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            mm.generate_batch(prompts, max_new=steps)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        row[f"tok_s_b{batch}"] = batch * steps / statistics.median(times)
    state = mm.new_state(PROMPT_LEN + 2)
    mm.prefill(list(range(3, 3 + PROMPT_LEN)), state)
    row["decode_step_ms"] = 1e3 * statistics.median(mm.decode_step_timed(5, PROMPT_LEN, state)[1] for _ in range(reps))
    return row, weight_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", default=",".join(SHAPES))
    args = ap.parse_args()
    from kernels import get_kernel

    di = get_kernel("phanerozoic/det-infer", version=1)
    device = "cuda"
    bw = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name()}: device-to-device copy {bw / 1e9:.0f} GB/s; {args.steps} decode steps "
          f"after a {PROMPT_LEN}-token prompt, median of {args.reps}")
    print("| model | weights GB | b1 tok/s | b16 tok/s | b16/b1 | decode_step ms | floor tok/s | b1 % of floor |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        row, weight_bytes = bench(di, name, args.steps, args.reps, device)
        floor = bw / weight_bytes
        print(f"| {name} | {row['weights_gb']:.2f} | {row['tok_s_b1']:.0f} | {row['tok_s_b16']:.0f} | "
              f"{row['tok_s_b16'] / row['tok_s_b1']:.1f}x | {row['decode_step_ms']:.3f} | {floor:.0f} | "
              f"{100 * row['tok_s_b1'] / floor:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
