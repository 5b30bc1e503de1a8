"""Read a llama.cpp GGUF checkpoint as a Hugging Face-style config dict and bf16 tensors.

GGUF (v2/v3): a header of typed key-value metadata (`{arch}.block_count`, `{arch}.attention.head_count`,
...) and a table of tensors, each with a ggml type (F32, F16, BF16, Q8_0, Q4_K, ...) and a shape
listed innermost-first. gguf_header.py reads the header; the gguf package (gguf-py, imported only
here) dequantizes every type it knows to fp32 from the mapped file. Each tensor is then rounded
once to bf16 (nearest even), which is the defined weight of the model (docs/SPEC.md §13.1).
llama.cpp's converter permutes the rows of the Q and K projections (and their biases) of
"llama"-architecture models for its rope kernel; that is undone here, as transformers does, so
the weights match the Hugging Face layout exactly. Attention biases (qwen2's q, k, v; a llama model's four) come as attn_*.bias tensors.
"""
import torch

from .gguf_header import GGUFError, MetadataArray, read_header

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
    "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
    "blk.{i}.attn_output.bias": "model.layers.{i}.self_attn.o_proj.bias",
    "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
# Gemma-3 names its norms by place (names.py): llama's "ffn_norm" is its pre-feedforward norm.
_GEMMA3_NAMES = {
    "blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.pre_feedforward_layernorm.weight",
    "blk.{i}.post_ffw_norm.weight": "model.layers.{i}.post_feedforward_layernorm.weight",
}
# GGUF architecture -> (transformers class, whether llama.cpp permuted Q/K)
SUPPORTED_GGUF_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", True),
    "mistral": ("MistralForCausalLM", True),
    "qwen3": ("Qwen3ForCausalLM", False),
    "qwen2": ("Qwen2ForCausalLM", False),
    "gemma3": ("Gemma3ForCausalLM", False),
}
# Family -> transformers' tokenizer_type for MegaModel.tokenizer(): the class AutoTokenizer picks
# from the GGUF's config, given where deriving that config costs a second gguf-py parse of a large
# vocabulary (the families not named take AutoTokenizer's own path).
GGUF_TOKENIZER_TYPES = {"gemma3": "gemma3_text", "qwen2": "qwen2"}
# What llama.cpp assumes for every gemma3 GGUF rather than storing it (its llama-model.cpp): five
# sliding layers then one full, and the sliding layers' rope base.
GEMMA3_SLIDING_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0


_NAMES_BY_ARCH = {"gemma3": {**_NAMES, **_GEMMA3_NAMES}}


def _hf_name(name, arch):
    table = _NAMES_BY_ARCH.get(arch, _NAMES)
    if name in table:
        return table[name]
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
        key = ".".join(["blk", "{i}"] + parts[2:])
        if key in table:
            return table[key].format(i=int(parts[1]))
    return None


def _field(header, key, required=True, default=None):
    if key not in header.fields:
        if required:
            raise GGUFError(f"det-infer: GGUF metadata lacks {key!r}")
        return default
    value = header.fields[key]
    if isinstance(value, MetadataArray):
        raise GGUFError(f"det-infer: GGUF metadata {key!r} is an array of {value.count}; a single value was expected")
    return value


def _count(header, key, required=True, default=None, low=1, high=1 << 31):
    """An integer field within [low, high] (shapes, counts): anything else names the field."""
    value = _field(header, key, required, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise GGUFError(f"det-infer: GGUF metadata {key!r} = {value!r} is not an integer in [{low}, {high}]")
    return value


def _number(header, key, required=True, default=None):
    value = _field(header, key, required, default)
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


def read_gguf(path):
    """(config dict in Hugging Face form, {hf name: bf16 tensor}) of a GGUF file. A malformed file is
    a GGUFError (a ValueError) that says what is wrong, whatever part of it lies."""
    try:
        import gguf  # noqa: F401 (its dequantizers)
    except ImportError:
        raise ImportError("det-infer: reading GGUF needs the gguf package (pip install gguf)") from None
    header = read_header(path)
    try:
        return _convert(header, path)
    except GGUFError:
        raise
    except _MALFORMED as e:
        raise GGUFError(f"det-infer: {path} is a malformed GGUF file ({type(e).__name__}: {e})") from None


def _tensor_values(data, t):
    """fp32 values of tensor t (shape outermost first), dequantized by gguf-py from the mapped file."""
    import gguf
    import numpy as np

    try:
        qtype = gguf.GGMLQuantizationType(t.ggml_type)
        block, type_bytes = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise GGUFError(f"det-infer: GGUF tensor {t.name!r} has ggml type {t.ggml_type}, which is not a known "
                        "type") from None
    if not t.dims or t.dims[0] % block:
        raise GGUFError(f"det-infer: GGUF tensor {t.name!r} has shape {list(t.dims)}: its rows must be a nonzero "
                        f"multiple of {qtype.name}'s block of {block} values")
    shape = [int(s) for s in reversed(t.dims)]
    n_bytes = int(np.prod(shape, dtype=object)) // block * type_bytes
    if t.offset + n_bytes > data.shape[0]:
        raise GGUFError(f"det-infer: GGUF tensor {t.name!r} ({n_bytes} bytes at {t.offset}) runs past the end of "
                        f"the file ({data.shape[0]} bytes)")
    raw = data[t.offset:t.offset + n_bytes].reshape(*shape[:-1], shape[-1] // block * type_bytes)
    try:
        values = gguf.quants.dequantize(raw, qtype)
    except NotImplementedError:
        raise GGUFError(f"det-infer: GGUF tensor {t.name!r} has type {qtype.name}, which the gguf package cannot "
                        "dequantize") from None
    return np.asarray(values, dtype=np.float32).reshape(shape)


def _convert(header, path):
    import numpy as np
    arch = _field(header, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise GGUFError(f"det-infer: GGUF architecture {arch!r} is not supported; supported: "
                        f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}")
    hf_arch, permuted = SUPPORTED_GGUF_ARCHITECTURES[arch]
    if any(t.name == "rope_freqs.weight" for t in header.tensors):
        raise GGUFError("det-infer: GGUF rope_freqs (llama3 rope scaling stored as factors) is not supported yet")
    scaling = _field(header, f"{arch}.rope.scaling.type", required=False)
    if scaling not in (None, "none") and not (arch == "gemma3" and scaling == "linear"):
        raise GGUFError(f"det-infer: GGUF rope scaling {scaling!r} is not supported (only linear, for gemma3)")
    heads = _count(header, f"{arch}.attention.head_count")
    kv_heads = _count(header, f"{arch}.attention.head_count_kv", False, heads)
    hidden = _count(header, f"{arch}.embedding_length")
    head_dim = _count(header, f"{arch}.attention.key_length", False, max(1, hidden // heads))
    tensors = {}
    data = np.memmap(path, mode="r")
    for t in header.tensors:
        name = _hf_name(t.name, arch)
        if name is None:
            raise GGUFError(f"det-infer: GGUF tensor {t.name!r} has no place in a {arch} model")
        values = _tensor_values(data, t)
        if permuted and t.name.endswith((".attn_q.weight", ".attn_q.bias")):
            values = _unpermute(values, heads)
        elif permuted and t.name.endswith((".attn_k.weight", ".attn_k.bias")):
            values = _unpermute(values, kv_heads)
        if arch == "gemma3" and t.name.endswith("norm.weight"):
            values = values - np.float32(1.0)  # llama.cpp stores Gemma's 1 + w; names.py adds the 1 back
        tensors[name] = torch.from_numpy(np.array(values, dtype=np.float32)).to(torch.bfloat16)  # a copy
    vocab = tensors["model.embed_tokens.weight"].shape[0] if "model.embed_tokens.weight" in tensors else None
    config = {
        "architectures": [hf_arch],
        "hidden_size": hidden,
        "num_hidden_layers": _count(header, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": _count(header, f"{arch}.feed_forward_length"),
        "vocab_size": _count(header, f"{arch}.vocab_size", False, vocab),
        "rms_norm_eps": _number(header, f"{arch}.attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": _count(header, f"{arch}.context_length", False, 4096),
        "rope_theta": _number(header, f"{arch}.rope.freq_base", False, 10000.0),
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "hidden_act": "silu",
        "bos_token_id": _field(header, "tokenizer.ggml.bos_token_id", False),
        "eos_token_id": _field(header, "tokenizer.ggml.eos_token_id", False),
    }
    if arch != "qwen2" and any(n.endswith("_proj.bias") for n in tensors):
        config["attention_bias"] = True  # GGUF stores no flag: the tensors say it (all four must be there)
    rope_dim = _count(header, f"{arch}.rope.dimension_count", False, head_dim)
    if rope_dim != head_dim:
        config["partial_rotary_factor"] = rope_dim / head_dim
    if arch == "mistral":
        window = _count(header, f"{arch}.attention.sliding_window", False, 0, low=0)
        if window:
            config["sliding_window"] = window
    if arch == "gemma3":
        _gemma3_config(header, config, scaling)
    return config, tensors


def _gemma3_config(header, config, scaling):
    """The Gemma3ForCausalLM fields of a gemma3 GGUF, with llama.cpp's built-in values for what the
    file does not store."""
    del config["hidden_act"]
    full = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    if scaling == "linear":
        full = {"rope_type": "linear", "rope_theta": full["rope_theta"],
                "factor": _number(header, "gemma3.rope.scaling.factor")}
    n = config["num_hidden_layers"]
    # llama.cpp scales scores by 1/sqrt(head_dim), except for the 62-layer 27B model, whose
    # query_pre_attn_scalar is hidden_size / heads.
    scalar = config["hidden_size"] // config["num_attention_heads"] if n == 62 else config["head_dim"]
    config.update({
        "model_type": "gemma3_text",
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": _count(header, "gemma3.attention.sliding_window"),
        "query_pre_attn_scalar": scalar,
        "sliding_window_pattern": GEMMA3_SLIDING_PATTERN,  # config.py derives the layer types
        "rope_parameters": {"full_attention": full,
                            "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_ROPE_THETA}},
    })
