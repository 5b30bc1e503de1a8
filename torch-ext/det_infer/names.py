"""The checkpoint tensors a model uses, by name, and the rule that every tensor in a checkpoint is
used exactly once (or named here as ignored). The native side binds each weight by these names
(det_model_from_cfg in model/det_model_cfg.h asks for them; torch-ext/model_args.cpp refuses a
missing, extra or repeated one)."""
import re

import torch

# Attention biases (Qwen2: q, k, v; attention_bias=True: all four), fp32 vectors like the norms.
QKV_BIASES = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")
O_BIAS = "self_attn.o_proj.bias"
ATTENTION_BIASES = QKV_BIASES + (O_BIAS,)
# Per-layer tensors in the order det_model_from_cfg (model/det_model_cfg.h) asks for them (the
# order matters only to the torch-free tools, tests/native/engine_digest.cpp, which read a list).
LLAMA_LAYER_TENSORS = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    *ATTENTION_BIASES,
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
    *ATTENTION_BIASES,
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "post_attention_layernorm.weight",  # the attention output's norm
    "pre_feedforward_layernorm.weight",  # the MLP's input norm
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_feedforward_layernorm.weight",  # the MLP output's norm
)
ONES_V_NORM = "=ones:self_attn.v_norm"  # made here: the multipliers 1 of Gemma-4's weightless v norm
# Gemma-4 (docs/SPEC.md §13.7): k_proj, v_proj, k_norm and the weightless v norm only on the layers
# with their own K/V; the per-layer input branch and layer_scalar on every layer.
GEMMA4_LAYER_TENSORS = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    *ATTENTION_BIASES,
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    ONES_V_NORM,
    "post_attention_layernorm.weight",
    "pre_feedforward_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "post_feedforward_layernorm.weight",
    "per_layer_input_gate.weight",
    "per_layer_projection.weight",
    "post_per_layer_input_norm.weight",
    "layer_scalar",
)
_QK_NORM = {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}
_OWN_KV = {"self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight", ONES_V_NORM,
           "self_attn.k_proj.bias", "self_attn.v_proj.bias"}
SOFTCAP = "=softcap"  # made here: the final softcapping value, a (1,) fp32 tensor
PLE_TENSORS = ("model.embed_tokens_per_layer.weight", "model.per_layer_model_projection.weight",
               "model.per_layer_projection_norm.weight")
# Present in some checkpoints, never used: buffers recomputed exactly by rope.py.
IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


def llama_tensor_names(cfg):
    """The names of the engine's weights, in det_model_from_cfg's order: checkpoint names, and
    entries starting with "=" that are made here (names.SOFTCAP, names.ONES_V_NORM)."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not cfg.tie_word_embeddings:
        names.append("lm_head.weight")
    if cfg.final_softcap is not None:
        names.append(SOFTCAP)
    if cfg.ple_dim:
        names += PLE_TENSORS
    layer = {"gemma3": GEMMA3_LAYER_TENSORS, "gemma4": GEMMA4_LAYER_TENSORS}.get(cfg.family, LLAMA_LAYER_TENSORS)
    for i in range(cfg.num_hidden_layers):
        for t in layer:
            if ((t in _QK_NORM and not cfg.qk_norm) or (t in _OWN_KV and cfg.kv_source(i) != i)
                    or (t in QKV_BIASES and not cfg.qkv_bias) or (t == O_BIAS and not cfg.o_bias)):
                continue
            names.append(f"model.layers.{i}.{t}")
    return names


def checkpoint_names(cfg):
    return [n for n in llama_tensor_names(cfg) if "=" not in n]


def to_bf16(name, t):
    """Weights run as bf16. bf16 is used as is (zero copy); fp32/fp16 are rounded to nearest even."""
    if t.dtype == torch.bfloat16:
        return t
    if t.dtype in (torch.float32, torch.float16):
        return t.to(torch.bfloat16)
    raise ValueError(f"det-infer: tensor {name!r} has dtype {t.dtype}; weights must be bf16, fp16 or fp32")


def norm_multipliers(name, t, offset):
    """A norm's fp32 multipliers (docs/SPEC.md §13.2): fl32(offset + w) with w the bf16 weight
    widened; offset 0 (llama, Gemma-4: w itself) or 1 (Gemma-3's 1 + w). Gemma-4's layer_scalar
    is taken the same way (offset 0)."""
    return (to_bf16(name, t).float() + offset).contiguous()


def is_norm(name):
    return name.endswith(("norm.weight", "layer_scalar"))


def is_bias(name):
    return name.endswith("_proj.bias")


def engine_tensor(cfg, name, t):
    """A dense checkpoint tensor as the engine takes it, after checking its shape: a projection or
    embedding rounded to bf16 (to_bf16), a norm's fp32 multipliers (norm_multipliers), or a
    bias as its bf16 value widened to fp32 (docs/SPEC.md §13.3 b)."""
    want = shape_of(cfg, name)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"det-infer: tensor {name!r} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != want:
        raise ValueError(f"det-infer: tensor {name!r} has shape {tuple(t.shape)}, expected {want}")
    if is_norm(name):
        return norm_multipliers(name, t, cfg.norm_offset)
    if is_bias(name):
        return to_bf16(name, t).float().contiguous()  # exactly the bf16 value (a -0 stays -0)
    return to_bf16(name, t).contiguous()


def shape_of(cfg, name):
    """The shape the engine expects of a weight list entry."""
    H, V, P, L = cfg.hidden_size, cfg.vocab_size, cfg.ple_dim, cfg.num_hidden_layers
    fixed = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H),
             SOFTCAP: (1,), "model.embed_tokens_per_layer.weight": (V, L * P),
             "model.per_layer_model_projection.weight": (L * P, H), "model.per_layer_projection_norm.weight": (P,)}
    if name in fixed:
        return fixed[name]
    i = int(name.split(".")[2])
    D, I = cfg.layer_head_dim(i), cfg.layer_intermediate_size(i)
    QD, KVD = cfg.num_attention_heads * D, cfg.num_key_value_heads * D
    part = name.split(".", 3)[3]
    return {"self_attn.q_proj.weight": (QD, H), "self_attn.q_proj.bias": (QD,), "self_attn.k_proj.bias": (KVD,),
            "self_attn.v_proj.bias": (KVD,), "self_attn.o_proj.bias": (H,), "self_attn.k_proj.weight": (KVD, H),
            "self_attn.v_proj.weight": (KVD, H), "self_attn.o_proj.weight": (H, QD),
            "self_attn.q_norm.weight": (D,), "self_attn.k_norm.weight": (D,), ONES_V_NORM: (D,),
            "mlp.gate_proj.weight": (I, H), "mlp.up_proj.weight": (I, H), "mlp.down_proj.weight": (H, I),
            "per_layer_input_gate.weight": (P, H), "per_layer_projection.weight": (H, P),
            "layer_scalar": (1,)}.get(part, (H,))  # the rest are hidden-size norms


def projection_shapes(cfg):
    """{name: (rows, cols)} of the per-layer projections (the weights that may be nf4-packed)."""
    return {n: shape_of(cfg, n) for n in checkpoint_names(cfg) if n.endswith("_proj.weight")}


def _made_here(cfg, name):
    if name == SOFTCAP:
        return torch.tensor([cfg.final_softcap], dtype=torch.float32)
    return torch.ones(shape_of(cfg, name), dtype=torch.float32)  # ONES_V_NORM


def select_llama_weights(cfg, tensors, scales=None):
    """(weights, scales): the engine's weights (parallel to llama_tensor_names) from a {name:
    tensor} checkpoint, and the
    parallel list of nf4 absmax tensors (an empty tensor for a dense weight; [] when nothing is
    packed). scales: {name: fp32 absmax} of the nf4 projections, whose tensors hold their codes as
    (rows, cols/2) uint8 (bnb_io.py). Errors list missing, unexpected and misshapen tensors by name."""
    scales = scales or {}
    entries = llama_tensor_names(cfg)
    needed = checkpoint_names(cfg)
    present = set(tensors)
    missing = [n for n in needed if n not in present]
    unused = sorted(n for n in present - set(needed) if not IGNORED.search(n))
    if cfg.tie_word_embeddings and "lm_head.weight" in unused:
        unused.remove("lm_head.weight")  # a tied head saved explicitly: the embedding is used
    if missing:
        raise ValueError(f"det-infer: checkpoint lacks {len(missing)} tensors the config needs, e.g. {missing[:5]}")
    if unused:
        raise ValueError(f"det-infer: checkpoint has {len(unused)} tensors this model does not use, e.g. {unused[:5]}")
    weights, absmax = [], []
    for name in entries:
        if "=" in name:
            weights.append(_made_here(cfg, name))
            absmax.append(torch.empty(0, dtype=torch.float32))
            continue
        t = tensors[name]
        if name in scales:
            rows, cols = shape_of(cfg, name)
            if tuple(t.shape) != (rows, cols // 2):
                raise ValueError(f"det-infer: tensor {name!r} has shape {tuple(t.shape)}, expected {(rows, cols // 2)}")
            weights.append(t.contiguous())
            absmax.append(scales[name])
        else:
            weights.append(engine_tensor(cfg, name, t))
            absmax.append(torch.empty(0, dtype=torch.float32))
    return weights, (absmax if scales else [])
