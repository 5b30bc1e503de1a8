"""One map from checkpoint tensor names to the engine's canonical order, and the rule that every
tensor in a checkpoint is used exactly once (or named here as ignored)."""
import re

import torch

# Per-layer tensors in the order the binding reads them (torch-ext/model_args.cpp, assemble()).
LLAMA_LAYER_TENSORS = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",  # qk-norm only
    "self_attn.k_norm.weight",  # qk-norm only
    "post_attention_layernorm.weight",  # the MLP's input norm
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
# Gemma-3 names its four norms by place: post_attention_layernorm normalizes the attention output.
GEMMA3_LAYER_TENSORS = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "post_attention_layernorm.weight",  # the attention output's norm
    "pre_feedforward_layernorm.weight",  # the MLP's input norm
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_feedforward_layernorm.weight",  # the MLP output's norm
)
_QK_NORM = {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}
# Present in some checkpoints, never used: buffers recomputed exactly by rope.py.
IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


def llama_tensor_names(cfg):
    """The checkpoint names the engine needs, in its canonical order."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not cfg.tie_word_embeddings:
        names.append("lm_head.weight")
    layer = GEMMA3_LAYER_TENSORS if cfg.family == "gemma3" else LLAMA_LAYER_TENSORS
    for i in range(cfg.num_hidden_layers):
        for t in layer:
            if t in _QK_NORM and not cfg.qk_norm:
                continue
            names.append(f"model.layers.{i}.{t}")
    return names


def to_bf16(name, t):
    """Weights run as bf16. bf16 is used as is (zero copy); fp32/fp16 are rounded to nearest even."""
    if t.dtype == torch.bfloat16:
        return t
    if t.dtype in (torch.float32, torch.float16):
        return t.to(torch.bfloat16)
    raise ValueError(f"det-infer: tensor {name!r} has dtype {t.dtype}; weights must be bf16, fp16 or fp32")


def norm_multipliers(name, t, offset):
    """A norm's fp32 multipliers (docs/SPEC.md §13.2): fl32(offset + w) with w the bf16 weight
    widened; offset 0 (llama: w itself) or 1 (Gemma's 1 + w)."""
    return (to_bf16(name, t).float() + offset).contiguous()


def is_norm(name):
    return name.endswith("norm.weight")


def _shapes(cfg):
    H, D, I, V = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    QD, KVD = cfg.num_attention_heads * D, cfg.num_key_value_heads * D
    return {"embed_tokens": (V, H), "model.norm": (H,), "lm_head": (V, H), "input_layernorm": (H,),
            "q_proj": (QD, H), "k_proj": (KVD, H), "v_proj": (KVD, H), "o_proj": (H, QD),
            "q_norm": (D,), "k_norm": (D,), "post_attention_layernorm": (H,), "gate_proj": (I, H),
            "up_proj": (I, H), "down_proj": (H, I), "pre_feedforward_layernorm": (H,),
            "post_feedforward_layernorm": (H,)}


def _shape_of(shapes, name):
    return shapes[next(k for k in shapes if k in name)]


def projection_shapes(cfg):
    """{name: (rows, cols)} of the per-layer projections (the weights that may be nf4-packed)."""
    shapes = _shapes(cfg)
    return {n: _shape_of(shapes, n) for n in llama_tensor_names(cfg) if n.endswith("_proj.weight")}


def select_llama_weights(cfg, tensors, scales=None):
    """(weights, scales): the engine's weight list from a {name: tensor} checkpoint, and the
    parallel list of nf4 absmax tensors (an empty tensor for a dense weight; [] when nothing is
    packed). scales: {name: fp32 absmax} of the nf4 projections, whose tensors hold their codes as
    (rows, cols/2) uint8 (bnb_io.py). Errors list missing, unexpected and misshapen tensors by name."""
    scales = scales or {}
    needed = llama_tensor_names(cfg)
    present = set(tensors)
    missing = [n for n in needed if n not in present]
    unused = sorted(n for n in present - set(needed) if not IGNORED.search(n))
    if cfg.tie_word_embeddings and "lm_head.weight" in unused:
        unused.remove("lm_head.weight")  # a tied head saved explicitly: the embedding is used
    if missing:
        raise ValueError(f"det-infer: checkpoint lacks {len(missing)} tensors the config needs, e.g. {missing[:5]}")
    if unused:
        raise ValueError(f"det-infer: checkpoint has {len(unused)} tensors this model does not use, e.g. {unused[:5]}")
    shapes = _shapes(cfg)
    weights, absmax = [], []
    for name in needed:
        t = tensors[name]
        want = _shape_of(shapes, name)
        if name in scales:
            want = (want[0], want[1] // 2)
        if tuple(t.shape) != want:
            raise ValueError(f"det-infer: tensor {name!r} has shape {tuple(t.shape)}, expected {want}")
        if name in scales:
            weights.append(t.contiguous())
            absmax.append(scales[name])
        elif is_norm(name):
            weights.append(norm_multipliers(name, t, cfg.norm_offset))
            absmax.append(torch.empty(0, dtype=torch.float32))
        else:
            weights.append(to_bf16(name, t).contiguous())
            absmax.append(torch.empty(0, dtype=torch.float32))
    return weights, (absmax if scales else [])
