"""Model configuration from a Hugging Face config.json: typed, validated, nothing guessed from names.

Every field that changes the math is read here and either supported or refused with an error that
names it. The engine receives the integer fields as LLAMA_CFG_FIELDS (the order the binding's cfg
enum expects, torch-ext/llama_binding.cpp).
"""
from dataclasses import dataclass, field

import torch

from . import bnb_io, rope

# architecture name in config.json -> the family name used here
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
    "Gemma3ForCausalLM": "gemma3",
}
_MODEL_TYPES = {"llama": "llama", "qwen3": "qwen3", "mistral": "mistral", "gemma3_text": "gemma3"}
# The MLP activation each family's config may name (transformers' ACT2FN names) -> the engine's
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
_ACT_CODES = {"silu": 0, "gelu_tanh": 1}  # DET_ACT_* in contract/det_llama_model.h

LLAMA_CFG_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "intermediate_size", "vocab_size", "rope_pairs", "rope_tables", "qk_norm",
                    "tie_word_embeddings", "out_norms", "act", "attn_scale_dim", "embed_scale")
# ...followed by (window, rope table) for every layer.
GEMMA_LAYER_TYPES = ("sliding_attention", "full_attention")


# Upper bounds far above any released model of these families: a huge value from a hostile or
# corrupt config is refused before anything is sized from it (a tensor-name list, a rope table).
MAXIMUM = {"hidden_size": 1 << 16, "num_hidden_layers": 1 << 10, "num_attention_heads": 1 << 10,
           "num_key_value_heads": 1 << 10, "head_dim": 1 << 12, "intermediate_size": 1 << 18,
           "vocab_size": 1 << 22}


def _int(d, key, default=None, minimum=1):
    value = d.get(key, default)
    if value is None:
        raise ValueError(f"det-infer: config.json has no {key!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"det-infer: config field {key!r} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"det-infer: config field {key!r} must be >= {minimum}, got {value}")
    if value > MAXIMUM.get(key, 1 << 62):
        raise ValueError(f"det-infer: config field {key!r} = {value} is above the supported maximum "
                         f"{MAXIMUM[key]}")
    return value


def _flag_off(d, key, what):
    if d.get(key):
        raise ValueError(f"det-infer: config field {key!r} = {d[key]!r} is not supported ({what})")


@dataclass(frozen=True)
class ModelConfig:
    family: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    qk_norm: bool
    sliding_window: int  # 0 = full causal attention (Gemma: the window of its sliding layers)
    max_position_embeddings: int
    rope_parameters: dict = field(hash=False)  # table 0's rope (Gemma: the full-attention layers')
    eos_token_ids: tuple = ()
    bos_token_id: int = None
    quantization: str = None  # "nf4": bitsandbytes 4-bit projections (bnb_io.py); None: dense
    # Gemma's differences from llama (docs/SPEC.md §13): the defaults are llama's.
    hidden_act: str = "silu"  # or "gelu_tanh"
    norm_offset: float = 0.0  # norm multipliers are fl32(offset + weight): Gemma's 1 + w
    out_norms: bool = False  # attention and MLP outputs are normalized before the residual add
    attn_scale_dim: int = 0  # scores scaled by rsqrt(this); 0: head_dim
    embed_scale: bool = False  # embeddings multiplied by fl32(sqrt(hidden_size))
    layer_types: tuple = ()  # Gemma: "sliding_attention" / "full_attention" per layer
    local_rope_parameters: dict = field(default=None, hash=False)  # rope of the sliding layers (table 1)

    @staticmethod
    def from_dict(d: dict) -> "ModelConfig":
        if not isinstance(d, dict):
            raise TypeError("det-infer: a config must be a dict (the parsed config.json)")
        archs = d.get("architectures") or []
        family = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if family is None:
            family = _MODEL_TYPES.get(d.get("model_type")) if not archs else None
        if family is None:
            raise ValueError(f"det-infer: unsupported architecture {archs or d.get('model_type')!r}; "
                             f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        act_key = "hidden_activation" if family == "gemma3" else "hidden_act"
        act = d.get(act_key, "gelu_pytorch_tanh" if family == "gemma3" else "silu")
        if ACTIVATIONS.get(act) != ("gelu_tanh" if family == "gemma3" else "silu"):
            want = "gelu_pytorch_tanh" if family == "gemma3" else "silu"
            raise ValueError(f"det-infer: config field {act_key!r} = {act!r} is not supported (only {want!r})")
        quantization = bnb_io.check_config(d["quantization_config"]) if d.get("quantization_config") else None
        _flag_off(d, "attention_bias", "no attention biases")
        _flag_off(d, "mlp_bias", "no MLP biases")
        if d.get("pretraining_tp", 1) not in (1, None):
            raise ValueError(f"det-infer: config field 'pretraining_tp' = {d['pretraining_tp']!r} is not supported (only 1)")
        if family == "qwen3":
            _flag_off(d, "use_sliding_window", "Qwen3 sliding-window layers")
        hidden = _int(d, "hidden_size")
        heads = _int(d, "num_attention_heads")
        kv_heads = _int(d, "num_key_value_heads", heads)
        if heads % kv_heads:
            raise ValueError(f"det-infer: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        head_dim = d.get("head_dim") or hidden // heads
        head_dim = _int({"head_dim": head_dim}, "head_dim")
        window = 0
        if family in ("mistral", "gemma3") and d.get("sliding_window") is not None:
            window = _int(d, "sliding_window")
        elif family == "llama" and d.get("sliding_window"):
            raise ValueError("det-infer: config field 'sliding_window' is not supported for llama")
        gemma = _gemma3_fields(d, window, head_dim) if family == "gemma3" else {}
        eps = d.get("rms_norm_eps", 1e-6)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"det-infer: config field 'rms_norm_eps' must be a positive number, got {eps!r}")
        eos = d.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        params = gemma.pop("rope_parameters", None) or rope.rope_parameters(d)
        cfg = ModelConfig(
            family=family, hidden_size=hidden, num_hidden_layers=_int(d, "num_hidden_layers"),
            num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
            intermediate_size=_int(d, "intermediate_size"), vocab_size=_int(d, "vocab_size"),
            rms_norm_eps=float(eps), tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qk_norm=family in ("qwen3", "gemma3"), sliding_window=window,
            max_position_embeddings=_int(d, "max_position_embeddings", 4096),
            rope_parameters=params, eos_token_ids=eos, bos_token_id=d.get("bos_token_id"),
            quantization=quantization, hidden_act=ACTIVATIONS[act], **gemma)
        cfg.inv_freq()  # validates the rope settings now, with the config's error messages
        return cfg

    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rope_parameters.get("partial_rotary_factor", 1.0))

    def rope_tables(self) -> list:
        """The rope settings of each inv_freq table: [all layers], or Gemma's [full, sliding]."""
        return [self.rope_parameters] + ([self.local_rope_parameters] if self.local_rope_parameters else [])

    def inv_freq(self):
        """(tables * rotary_dim/2,) float64: the tables of rope_tables() one after the other."""
        return torch.cat([rope.inv_freq(self.head_dim, p, p.get("partial_rotary_factor", 1.0))
                          for p in self.rope_tables()])

    def layer_windows(self) -> list:
        """Per layer: the attention window (0: full causal attention) and the rope table."""
        if not self.layer_types:
            return [(self.sliding_window, 0)] * self.num_hidden_layers
        return [(self.sliding_window, 1) if t == "sliding_attention" else (0, 0) for t in self.layer_types]

    def engine_ints(self) -> list:
        """The integer config in LLAMA_CFG_FIELDS order, then (window, rope table) per layer."""
        ints = [self.hidden_size, self.num_hidden_layers, self.num_attention_heads, self.num_key_value_heads,
                self.head_dim, self.intermediate_size, self.vocab_size, self.rotary_dim() // 2,
                len(self.rope_tables()), int(self.qk_norm), int(self.tie_word_embeddings), int(self.out_norms),
                _ACT_CODES[self.hidden_act], self.attn_scale_dim or self.head_dim, int(self.embed_scale)]
        return ints + [v for pair in self.layer_windows() for v in pair]

    def kv_bytes_per_position(self) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 4


def _gemma3_fields(d, window, head_dim):
    """The Gemma-3 switches of ModelConfig from a Gemma3ForCausalLM config (transformers 5 keys,
    and the older rope_theta / rope_local_base_freq / sliding_window_pattern ones)."""
    for key, what in (("final_logit_softcapping", "a softcapped head"),
                      ("attn_logit_softcapping", "softcapped attention scores"),
                      ("use_bidirectional_attention", "bidirectional attention")):
        _flag_off(d, key, what)
    n = _int(d, "num_hidden_layers")
    types = d.get("layer_types")
    if types is None:
        pattern = _int(d, "sliding_window_pattern", 6)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if not isinstance(types, (list, tuple)) or len(types) != n or any(t not in GEMMA_LAYER_TYPES for t in types):
        raise ValueError(f"det-infer: config field 'layer_types' must list {n} entries of {GEMMA_LAYER_TYPES}, "
                         f"got {types!r}")
    if "sliding_attention" in types and window < 1:
        raise ValueError("det-infer: Gemma sliding-attention layers need config field 'sliding_window'")
    params = d.get("rope_parameters") or {}
    if set(params) <= set(GEMMA_LAYER_TYPES) and params:
        full, local = dict(params.get("full_attention") or {}), dict(params.get("sliding_attention") or {})
    else:  # the older flat fields
        full = rope.rope_parameters({**d, "rope_theta": d.get("rope_theta", 1_000_000.0)})
        local = {"rope_type": "default"}
        if d.get("rope_local_base_freq") is not None:
            local["rope_theta"] = d["rope_local_base_freq"]
    full.setdefault("rope_type", "default")
    full.setdefault("rope_theta", 1_000_000.0)
    local.setdefault("rope_type", "default")
    local.setdefault("rope_theta", 10_000.0)
    scalar = _int(d, "query_pre_attn_scalar", head_dim)
    return {"norm_offset": 1.0, "out_norms": True, "attn_scale_dim": scalar, "embed_scale": True,
            "layer_types": tuple(types), "rope_parameters": full, "local_rope_parameters": local}
