#!/usr/bin/env python3
"""GPU decode throughput of the megakernel (scripts/device_check.sh runs it on a lent GPU;
docs/RESULTS.md §9 records the table). Models with the shapes of SmolLM2-135M and Llama-3.2-1B and
random bf16 weights made on the device (speed does not depend on the values; the real checkpoints are
not carried to the device machine). For each: decode tokens/s at batch 1 and 16 (generate_batch: one
launch runs the prompt and every step; tokens/s = batch x steps / seconds of the whole call), the
device time of one decode_step, and the weight-bandwidth floor (weight bytes per token over a
device-to-device copy bandwidth measured in the same run). Medians of --reps runs.

    LOCAL_KERNELS=phanerozoic/det-infer=$PWD/build python3 benchmarks/bench_gpu.py [--steps 128] [--reps 3]

--executor emulated runs the same code on the CPU under host emulation (scripts/device_check.sh
--dry-run: the model synthetic-llama, det_fixtures/synthetic.py's llama shape, few steps), to prove the
benchmark itself works before a GPU run depends on it; its figures mean nothing for the GPU.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

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


def config(name):
    if name.startswith("synthetic-"):  # a det_fixtures/synthetic.py config, whole
        from det_fixtures import synthetic
        return dict(synthetic.CONFIGS[name.removeprefix("synthetic-")])
    return dict(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5, tie_word_embeddings=True,
                hidden_act="silu", bos_token_id=1, eos_token_id=2, **SHAPES[name])


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


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


def copy_bandwidth(device, mib=1024):
    """Bytes per second of a device-to-device copy of `mib` MiB (read + write counted)."""
    a = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(5):
        sync(device)
        t = time.perf_counter()
        b.copy_(a)
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * a.numel() / statistics.median(times)


def bench(di, name, steps, reps, device, executor=None, batches=(1, 16), prompt_len=PROMPT_LEN):
    cfg = di.ModelConfig.from_dict(config(name))
    mm = di.MegaModel(cfg, random_weights(di, cfg, device), device=device, max_context=prompt_len + steps + 1,
                      executor=executor)
    weight_bytes = sum(w.numel() * w.element_size() for w in mm._weights)
    row = {"model": name, "weights_gb": weight_bytes / 1e9, "geometry": None}
    vocab = cfg.vocab_size
    for batch in batches:
        prompts = [[(31 * b + 7 * i) % (vocab - 3) + 3 for i in range(prompt_len)] for b in range(batch)]
        mm.generate_batch(prompts, max_new=min(4, steps))  # warm-up (module load, first launch)
        times = []
        for _ in range(reps):
            sync(device)
            t = time.perf_counter()
            mm.generate_batch(prompts, max_new=steps)
            sync(device)
            times.append(time.perf_counter() - t)
        row[f"tok_s_b{batch}"] = batch * steps / statistics.median(times)
    state = mm.new_state(prompt_len + 2)
    mm.prefill([(3 + i) % vocab for i in range(prompt_len)], state)
    row["decode_step_ms"] = 1e3 * statistics.median(mm.decode_step_timed(5, prompt_len, state)[1] for _ in range(reps))
    return row, weight_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", default=",".join(SHAPES),
                    help=f"comma-separated: {', '.join(SHAPES)}, or synthetic-<det_fixtures/synthetic.py family>")
    ap.add_argument("--executor", choices=["megakernel", "emulated"], default="megakernel",
                    help="emulated: the device code on the CPU (a dry run of this script, not a measurement)")
    ap.add_argument("--batches", default="1,16", help="two batch sizes, the first 1")
    ap.add_argument("--prompt-len", type=int, default=PROMPT_LEN)
    ap.add_argument("--copy-mib", type=int, default=1024, help="size of the bandwidth-measuring copy")
    args = ap.parse_args()
    from kernels import get_kernel

    di = get_kernel("phanerozoic/det-infer", version=1)
    device = "cuda" if args.executor == "megakernel" else "cpu"
    b1, bn = (int(b) for b in args.batches.split(","))
    bw = copy_bandwidth(device, args.copy_mib)
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU, emulated executor (dry run)"
    print(f"{where}: device-to-device copy {bw / 1e9:.0f} GB/s; {args.steps} decode steps "
          f"after a {args.prompt_len}-token prompt, median of {args.reps}")
    print(f"| model | weights GB | b{b1} tok/s | b{bn} tok/s | b{bn}/b{b1} | decode_step ms | floor tok/s | "
          f"b{b1} % of floor |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        row, weight_bytes = bench(di, name, args.steps, args.reps, device, args.executor, (b1, bn), args.prompt_len)
        floor = bw / weight_bytes
        lo, hi = row[f"tok_s_b{b1}"], row[f"tok_s_b{bn}"]
        print(f"| {name} | {row['weights_gb']:.2f} | {lo:.0f} | {hi:.0f} | {hi / lo:.1f}x | "
              f"{row['decode_step_ms']:.3f} | {floor:.0f} | {100 * lo / floor:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
