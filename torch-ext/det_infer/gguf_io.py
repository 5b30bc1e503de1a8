"""Read a llama.cpp GGUF checkpoint as a Hugging Face-style config dict and bf16 tensors.

GGUF (v2/v3): a header of typed key-value metadata (`{arch}.block_count`, `{arch}.attention.head_count`,
...) and a table of tensors, each with a ggml type (F32, F16, BF16, Q8_0, Q4_K, ...) and a shape
listed innermost-first. The gguf package (gguf-py, imported only here) parses the file and
dequantizes every type it knows to fp32. Each tensor is then rounded once to bf16 (nearest even),
which is the defined weight of the model (docs/SPEC.md §13.1). llama.cpp's converter permutes the
rows of the Q and K projections of "llama"-architecture models for its rope kernel; that is undone
here, as transformers does, so the weights match the Hugging Face layout exactly.
"""
import torch

# GGUF tensor names -> Hugging Face names ({i} is the layer).
_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
# GGUF architecture -> (transformers class, whether llama.cpp permuted Q/K)
SUPPORTED_GGUF_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", True),
    "mistral": ("MistralForCausalLM", True),
    "qwen3": ("Qwen3ForCausalLM", False),
}


class GGUFError(ValueError):
    pass


def _hf_name(name):
    if name in _NAMES:
        return _NAMES[name]
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
        key = ".".join(["blk", "{i}"] + parts[2:])
        if key in _NAMES:
            return _NAMES[key].format(i=int(parts[1]))
    return None


def _field(reader, key, required=True, default=None):
    f = reader.fields.get(key)
    if f is None:
        if required:
            raise GGUFError(f"det-infer: GGUF metadata lacks {key!r}")
        return default
    value = f.contents()
    return value


def _count(reader, key, required=True, default=None, low=1, high=1 << 31):
    """An integer field within [low, high] (shapes, counts): anything else names the field."""
    value = _field(reader, key, required, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise GGUFError(f"det-infer: GGUF metadata {key!r} = {value!r} is not an integer in [{low}, {high}]")
    return value


def _number(reader, key, required=True, default=None):
    value = _field(reader, key, required, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value == value:
        raise GGUFError(f"det-infer: GGUF metadata {key!r} = {value!r} is not a number")
    return float(value)


# What gguf-py and numpy raise on a malformed file (lying lengths, counts, offsets, types).
_MALFORMED = (ValueError, OSError, KeyError, IndexError, TypeError, OverflowError, ZeroDivisionError,
              UnicodeDecodeError, AttributeError, MemoryError)


def _unpermute(w, n_head):
    """Inverse of llama.cpp's permute(), which regrouped each head's rows from (2, d/2) to (d/2, 2)
    order: read them as (n_head, d/2, 2) and swap back."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise GGUFError(f"det-infer: a Q/K projection of {rows} rows does not split into {n_head} heads")
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _check_counts(path):
    """The header's version and tensor / key-value counts, checked against the file size before
    gguf-py walks them: a lying count must not make the reader build billions of entries."""
    import os
    import struct

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:4] != b"GGUF":
        raise GGUFError(f"det-infer: {path} is not a readable GGUF file (no GGUF magic and header)")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3):
        raise GGUFError(f"det-infer: {path} has GGUF version {version}; supported: 2 and 3")
    # Smallest entries: a key-value is a length-prefixed name, a type and a value (>= 13 bytes); a
    # tensor info is a length-prefixed name, a dimension count, a type and an offset (>= 24 bytes).
    if n_kv * 13 + n_tensors * 24 > size:
        raise GGUFError(f"det-infer: {path} claims {n_tensors} tensors and {n_kv} metadata entries, more than "
                        f"its {size} bytes can hold")


def read_gguf(path):
    """(config dict in Hugging Face form, {hf name: bf16 tensor}) of a GGUF file. A malformed file is
    a GGUFError (a ValueError) that says what is wrong, whatever part of it lies."""
    try:
        import gguf
    except ImportError:
        raise ImportError("det-infer: reading GGUF needs the gguf package (pip install gguf)") from None
    _check_counts(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except _MALFORMED as e:
        raise GGUFError(f"det-infer: {path} is not a readable GGUF file ({type(e).__name__}: {e})") from None
    try:
        return _convert(reader)
    except GGUFError:
        raise
    except _MALFORMED as e:
        raise GGUFError(f"det-infer: {path} is a malformed GGUF file ({type(e).__name__}: {e})") from None


def _convert(reader):
    import gguf
    import numpy as np
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise GGUFError(f"det-infer: GGUF architecture {arch!r} is not supported; supported: "
                        f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}")
    hf_arch, permuted = SUPPORTED_GGUF_ARCHITECTURES[arch]
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise GGUFError("det-infer: GGUF rope_freqs (llama3 rope scaling stored as factors) is not supported yet")
    if _field(reader, f"{arch}.rope.scaling.type", required=False) not in (None, "none"):
        raise GGUFError(f"det-infer: GGUF rope scaling {_field(reader, f'{arch}.rope.scaling.type')!r} "
                        "is not supported")
    heads = _count(reader, f"{arch}.attention.head_count")
    kv_heads = _count(reader, f"{arch}.attention.head_count_kv", False, heads)
    hidden = _count(reader, f"{arch}.embedding_length")
    head_dim = _count(reader, f"{arch}.attention.key_length", False, max(1, hidden // heads))
    tensors = {}
    for t in reader.tensors:
        name = _hf_name(t.name)
        if name is None:
            raise GGUFError(f"det-infer: GGUF tensor {t.name!r} has no place in a {arch} model")
        try:
            values = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise GGUFError(f"det-infer: GGUF tensor {t.name!r} has type {t.tensor_type.name}, which the "
                            "gguf package cannot dequantize") from None
        shape = [int(s) for s in reversed(t.shape)]
        values = np.asarray(values, dtype=np.float32).reshape(shape)
        if permuted and t.name.endswith(".attn_q.weight"):
            values = _unpermute(values, heads)
        elif permuted and t.name.endswith(".attn_k.weight"):
            values = _unpermute(values, kv_heads)
        tensors[name] = torch.from_numpy(np.array(values, dtype=np.float32)).to(torch.bfloat16)  # a copy
    vocab = tensors["model.embed_tokens.weight"].shape[0] if "model.embed_tokens.weight" in tensors else None
    config = {
        "architectures": [hf_arch],
        "hidden_size": hidden,
        "num_hidden_layers": _count(reader, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": _count(reader, f"{arch}.feed_forward_length"),
        "vocab_size": _count(reader, f"{arch}.vocab_size", False, vocab),
        "rms_norm_eps": _number(reader, f"{arch}.attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": _count(reader, f"{arch}.context_length", False, 4096),
        "rope_theta": _number(reader, f"{arch}.rope.freq_base", False, 10000.0),
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "hidden_act": "silu",
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id", False),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id", False),
    }
    rope_dim = _count(reader, f"{arch}.rope.dimension_count", False, head_dim)
    if rope_dim != head_dim:
        config["partial_rotary_factor"] = rope_dim / head_dim
    if arch == "mistral":
        window = _count(reader, f"{arch}.attention.sliding_window", False, 0, low=0)
        if window:
            config["sliding_window"] = window
    return config, tensors
