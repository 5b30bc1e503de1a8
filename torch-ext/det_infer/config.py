"""Model configuration from a Hugging Face config.json: typed, validated, nothing guessed from names.

Every field that changes the math is read here and either supported or refused with an error that
names it. The engine receives the integer fields as LLAMA_CFG_FIELDS (the order of the CFG_* enum
of model/det_model_cfg.h, which reads them).
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
    "Gemma4ForCausalLM": "gemma4",
    "Qwen2ForCausalLM": "qwen2",
}
_MODEL_TYPES = {"llama": "llama", "qwen3": "qwen3", "mistral": "mistral", "gemma3_text": "gemma3",
                "gemma4_text": "gemma4", "qwen2": "qwen2"}
# Families whose attention projections all carry a bias when config.json says attention_bias
# (transformers' classes read it); Qwen2's q, k and v always do, its o_proj never.
_ATTENTION_BIAS_FAMILIES = ("llama", "qwen3", "gemma3", "gemma4")
GEMMA = ("gemma3", "gemma4")
# The MLP activation each family's config may name (transformers' ACT2FN names) -> the engine's
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
_ACT_CODES = {"silu": 0, "gelu_tanh": 1}  # DET_ACT_* in contract/det_act.h

# The integer config the engine reads (engine_ints): these fields, then ROPE_TABLE_FIELDS per rope
# table, then LAYER_FIELDS per layer. The same table as DET_CFG_FIELDS in model/det_model_cfg.h
# (tests/test_model_api.py checks that the two agree).
LLAMA_CFG_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "max_head_dim", "max_intermediate_size", "vocab_size", "rope_tables", "qk_norm",
                    "tie_word_embeddings", "out_norms", "act", "attn_scale_dim", "embed_scale", "v_norm",
                    "ple_dim", "final_softcap", "layer_scalars", "qkv_bias", "o_bias")
ROPE_TABLE_FIELDS = ("pairs", "pair_offset")
LAYER_FIELDS = ("window", "rope_table", "head_dim", "intermediate_size", "kv_source")
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


def _bool(d, key, default=False):
    value = d.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"det-infer: config field {key!r} must be true or false, got {value!r}")
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
    # Gemma's differences from llama (docs/SPEC.md §13.6, §13.7): the defaults are llama's.
    hidden_act: str = "silu"  # or "gelu_tanh"
    norm_offset: float = 0.0  # norm multipliers are fl32(offset + weight): Gemma's 1 + w
    out_norms: bool = False  # attention and MLP outputs are normalized before the residual add
    attn_scale_dim: int = 0  # scores scaled by rsqrt(this); 0: head_dim
    embed_scale: bool = False  # embeddings multiplied by fl32(sqrt(hidden_size))
    layer_types: tuple = ()  # Gemma: "sliding_attention" / "full_attention" per layer
    local_rope_parameters: dict = field(default=None, hash=False)  # rope of the sliding layers (table 1)
    # Gemma-4's further differences (docs/SPEC.md §13.7).
    global_head_dim: int = 0  # head size of the full-attention layers; 0: head_dim
    kv_shared_layers: int = 0  # the last n layers attend over an earlier layer's K/V
    double_wide_mlp: bool = False  # those layers' MLP is twice intermediate_size wide
    ple_dim: int = 0  # per-layer input width (hidden_size_per_layer_input); 0: none
    final_softcap: float = None  # logits = c * tanh(z / c)
    v_norm: bool = False  # v heads are RMSNorm'ed (without a weight)
    layer_scalars: bool = False  # each layer ends by multiplying the stream by its layer_scalar
    # Attention biases (docs/SPEC.md §13.3 b, g): Qwen2's q, k, v; attention_bias=True: q, k, v, o.
    qkv_bias: bool = False
    o_bias: bool = False

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
        gemma = family in GEMMA
        act_key = "hidden_activation" if gemma else "hidden_act"
        act = d.get(act_key, "gelu_pytorch_tanh" if gemma else "silu")
        if ACTIVATIONS.get(act) != ("gelu_tanh" if gemma else "silu"):
            want = "gelu_pytorch_tanh" if gemma else "silu"
            raise ValueError(f"det-infer: config field {act_key!r} = {act!r} is not supported (only {want!r})")
        quantization = bnb_io.check_config(d["quantization_config"]) if d.get("quantization_config") else None
        if family not in _ATTENTION_BIAS_FAMILIES + ("qwen2",):
            _flag_off(d, "attention_bias", f"{archs[0] if archs else family} has no attention biases")
        _flag_off(d, "mlp_bias", "no MLP biases")
        if family == "qwen2":
            biases = {"qkv_bias": True, "o_bias": False}  # transformers' Qwen2Attention, whatever the config says
        else:
            on = family in _ATTENTION_BIAS_FAMILIES and _bool(d, "attention_bias")
            biases = {"qkv_bias": on, "o_bias": on}
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
        if family in ("mistral",) + GEMMA and d.get("sliding_window") is not None:
            window = _int(d, "sliding_window")
        elif family == "llama" and d.get("sliding_window"):
            raise ValueError("det-infer: config field 'sliding_window' is not supported for llama")
        gemma = _gemma3_fields(d, window, head_dim) if family == "gemma3" else \
            _gemma4_fields(d, window, head_dim) if family == "gemma4" else \
            _qwen2_fields(d) if family == "qwen2" else {}
        window = gemma.pop("sliding_window", window)
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
            qk_norm=family in ("qwen3",) + GEMMA, sliding_window=window,
            max_position_embeddings=_int(d, "max_position_embeddings", 4096),
            rope_parameters=params, eos_token_ids=eos, bos_token_id=d.get("bos_token_id"),
            quantization=quantization, hidden_act=ACTIVATIONS[act], **biases, **gemma)
        cfg.inv_freq()  # validates the rope settings now, with the config's error messages
        return cfg

    # ---- the shapes of each layer and rope table (the engine's cfg) ------------------------------
    def first_kv_shared_layer(self) -> int:
        return self.num_hidden_layers - self.kv_shared_layers

    def is_full_attention(self, l) -> bool:
        return not self.layer_types or self.layer_types[l] == "full_attention"

    def layer_head_dim(self, l) -> int:
        return self.global_head_dim if self.global_head_dim and self.is_full_attention(l) else self.head_dim

    def layer_intermediate_size(self, l) -> int:
        wide = self.double_wide_mlp and l >= self.first_kv_shared_layer()
        return self.intermediate_size * (2 if wide else 1)

    def kv_source(self, l) -> int:
        """The layer whose K/V layer l attends over: itself, or (Gemma-4's shared layers) the last
        layer before the shared ones of the same attention type."""
        first = self.first_kv_shared_layer()
        if l < first:
            return l
        return max(i for i in range(first) if self.is_full_attention(i) == self.is_full_attention(l))

    def rope_tables(self) -> list:
        """(rope settings, head size) of each table: [all layers], or Gemma's [full, sliding]."""
        full = (self.rope_parameters, self.global_head_dim or self.head_dim)
        return [full] + ([(self.local_rope_parameters, self.head_dim)] if self.local_rope_parameters else [])

    def _table(self, params, head_dim):
        return rope.inv_freq(head_dim, params, params.get("partial_rotary_factor", 1.0))

    def inv_freq(self):
        """(pairs of all tables,) float64: the tables of rope_tables() one after the other."""
        return torch.cat([self._table(p, d) for p, d in self.rope_tables()])

    def layer_rows(self) -> list:
        """Per layer, the LAYER_FIELDS: attention window (0: full causal), rope table, head size,
        MLP width, K/V source."""
        rows = []
        for l in range(self.num_hidden_layers):
            if self.layer_types:  # Gemma's sliding layers rotate by their own table; Qwen2's by the one table
                local = 1 if self.local_rope_parameters else 0
                window, table = (0, 0) if self.is_full_attention(l) else (self.sliding_window, local)
            else:
                window, table = self.sliding_window, 0
            rows.append((window, table, self.layer_head_dim(l), self.layer_intermediate_size(l), self.kv_source(l)))
        return rows

    def engine_ints(self) -> list:
        """LLAMA_CFG_FIELDS, then ROPE_TABLE_FIELDS per rope table, then LAYER_FIELDS per layer."""
        rows = self.layer_rows()
        fields = {
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "max_head_dim": max(r[2] for r in rows), "max_intermediate_size": max(r[3] for r in rows),
            "vocab_size": self.vocab_size, "rope_tables": len(self.rope_tables()), "qk_norm": int(self.qk_norm),
            "tie_word_embeddings": int(self.tie_word_embeddings), "out_norms": int(self.out_norms),
            "act": _ACT_CODES[self.hidden_act], "attn_scale_dim": self.attn_scale_dim or self.head_dim,
            "embed_scale": int(self.embed_scale), "v_norm": int(self.v_norm), "ple_dim": self.ple_dim,
            "final_softcap": int(self.final_softcap is not None), "layer_scalars": int(self.layer_scalars),
            "qkv_bias": int(self.qkv_bias), "o_bias": int(self.o_bias)}
        ints = [fields.pop(name) for name in LLAMA_CFG_FIELDS]
        assert not fields, f"fields outside LLAMA_CFG_FIELDS: {sorted(fields)}"
        for shape in self.rope_table_shapes():
            ints += list(shape)
        return ints + [v for row in rows for v in row]

    def rope_table_shapes(self) -> list:
        """ROPE_TABLE_FIELDS (pairs, pair offset) of each rope table: pairs (x_i, x_{i + offset})
        rotate, i < pairs."""
        shapes = []
        for params, head_dim in self.rope_tables():
            pairs = len(self._table(params, head_dim))
            shapes.append((pairs, rope.pair_offset(head_dim, params, pairs)))
        return shapes

    def kv_floats_per_position(self) -> int:
        """Floats of K (and of V) a sequence caches per position: the layers with their own K/V."""
        return sum(self.num_key_value_heads * self.layer_head_dim(l) for l in range(self.num_hidden_layers)
                   if self.kv_source(l) == l)

    def kv_bytes_per_position(self) -> int:
        return 2 * self.kv_floats_per_position() * 4


def _every_nth_full(n, pattern):
    """Gemma's layer pattern: layer l is full attention when (l + 1) is a multiple of pattern."""
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]


def _gemma_layer_types(d, n, window, default):
    """The n entries of 'layer_types' (default() when the config has none), checked, and the
    window the sliding ones need."""
    types = d.get("layer_types")
    if types is None:
        types = default()
    if not isinstance(types, (list, tuple)) or len(types) != n or any(t not in GEMMA_LAYER_TYPES for t in types):
        raise ValueError(f"det-infer: config field 'layer_types' must list {n} entries of {GEMMA_LAYER_TYPES}, "
                         f"got {types!r}")
    if "sliding_attention" in types and window < 1:
        raise ValueError("det-infer: Gemma sliding-attention layers need config field 'sliding_window'")
    return list(types)


def _gemma3_fields(d, window, head_dim):
    """The Gemma-3 switches of ModelConfig from a Gemma3ForCausalLM config (transformers 5 keys,
    and the older rope_theta / rope_local_base_freq / sliding_window_pattern ones)."""
    for key, what in (("final_logit_softcapping", "a softcapped head"),
                      ("attn_logit_softcapping", "softcapped attention scores"),
                      ("use_bidirectional_attention", "bidirectional attention")):
        _flag_off(d, key, what)
    n = _int(d, "num_hidden_layers")
    pattern = None if d.get("layer_types") is not None else _int(d, "sliding_window_pattern", 6)
    types = _gemma_layer_types(d, n, window, lambda: _every_nth_full(n, pattern))
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


def _gemma4_fields(d, window, head_dim):
    """The Gemma-4 switches of ModelConfig from a Gemma4ForCausalLM (gemma4_text) config: its
    layer pattern, the full layers' head size and proportional rope, KV sharing, the per-layer
    inputs, the final softcapping."""
    for key, what in (("attention_k_eq_v", "full layers whose V is their K"),
                      ("enable_moe_block", "mixture-of-experts blocks"),
                      ("use_bidirectional_attention", "bidirectional attention"),
                      ("attn_logit_softcapping", "softcapped attention scores")):
        _flag_off(d, key, what)
    n = _int(d, "num_hidden_layers")
    # transformers' default: five sliding layers then a full one, and the last layer full.
    types = _gemma_layer_types(d, n, window, lambda: _every_nth_full(n, 6)[:-1] + ["full_attention"])
    # The full layers' head size: "global_head_dim" (hub configs), or transformers 5's per-layer
    # overrides {"04": {"head_dim": 512}, ...}; 512 when neither says.
    global_dim = d.get("global_head_dim")
    overrides = d.get("per_layer_config") or {}
    for key, value in (overrides.items() if isinstance(overrides, dict) else ()):
        if isinstance(value, dict) and "head_dim" in value:
            global_dim = value["head_dim"]
    global_dim = _int({"global_head_dim": 512 if global_dim is None else global_dim}, "global_head_dim")
    shared = _int(d, "num_kv_shared_layers", 0, minimum=0)
    if shared >= n:
        raise ValueError(f"det-infer: num_kv_shared_layers {shared} leaves no layer with its own K/V")
    if not set(types[n - shared:]) <= set(types[: n - shared]):
        raise ValueError("det-infer: a KV-shared layer has no earlier layer of its attention type to read")
    params = d.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                  "rope_theta": 1_000_000.0})
    local = dict(params.get("sliding_attention") or {"rope_type": "default", "rope_theta": 10_000.0})
    ple = _int(d, "hidden_size_per_layer_input", 256, minimum=0)
    if ple and d.get("vocab_size_per_layer_input", d.get("vocab_size")) != d.get("vocab_size"):
        raise ValueError("det-infer: config field 'vocab_size_per_layer_input' must equal 'vocab_size' "
                         f"(got {d.get('vocab_size_per_layer_input')!r} and {d.get('vocab_size')!r})")
    cap = d.get("final_logit_softcapping")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
        raise ValueError(f"det-infer: config field 'final_logit_softcapping' must be a positive number, got {cap!r}")
    return {"norm_offset": 0.0, "out_norms": True, "attn_scale_dim": 1, "embed_scale": True,
            "layer_types": tuple(types), "rope_parameters": full, "local_rope_parameters": local,
            "global_head_dim": global_dim, "kv_shared_layers": shared,
            "double_wide_mlp": bool(d.get("use_double_wide_mlp", False)), "ple_dim": ple,
            "final_softcap": None if cap is None else float(cap), "v_norm": True, "layer_scalars": True}


def _qwen2_fields(d):
    """Qwen2's sliding-window layers as transformers' Qwen2Config defines them: with
    use_sliding_window and a sliding_window (default 4096; null: none), the layers listed as
    "sliding_attention" in layer_types (by default those from max_window_layers on) see the last
    sliding_window positions; otherwise every layer is full attention (layer_types listing sliding
    layers then is refused as contradictory). The sliding layers rotate by the model's one rope table."""
    window = d.get("sliding_window", 4096) if _bool(d, "use_sliding_window") else None
    if window is None:
        types = d.get("layer_types")
        if isinstance(types, (list, tuple)) and "sliding_attention" in types:
            raise ValueError("det-infer: config field 'layer_types' lists sliding_attention layers but no window "
                             "applies ('use_sliding_window' is false or 'sliding_window' is null)")
        return {}
    n = _int(d, "num_hidden_layers")
    window = _int({"sliding_window": window}, "sliding_window")
    first = _int(d, "max_window_layers", 28, minimum=0)
    types = _gemma_layer_types(d, n, window, lambda: ["sliding_attention" if i >= first else "full_attention"
                                                      for i in range(n)])
    if "sliding_attention" not in types:
        return {}
    return {"layer_types": tuple(types), "sliding_window": window}
