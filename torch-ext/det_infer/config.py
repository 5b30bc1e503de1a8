"""Model configuration from a Hugging Face config.json: typed, validated, nothing guessed from names.

Every field that changes the math is read here and either supported or refused with an error that
names it. The engine receives the integer fields as LLAMA_CFG_FIELDS (the order the binding's cfg
enum expects, torch-ext/llama_binding.cpp).
"""
from dataclasses import dataclass, field

from . import bnb_io, rope

# architecture name in config.json -> the family name used here
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
}
_MODEL_TYPES = {"llama": "llama", "qwen3": "qwen3", "mistral": "mistral"}

LLAMA_CFG_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "intermediate_size", "vocab_size", "rope_pairs", "sliding_window_or_0",
                    "qk_norm", "tie_word_embeddings")


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
    sliding_window: int  # 0 = full causal attention
    max_position_embeddings: int
    rope_parameters: dict = field(hash=False)
    eos_token_ids: tuple = ()
    bos_token_id: int = None
    quantization: str = None  # "nf4": bitsandbytes 4-bit projections (bnb_io.py); None: dense

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
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"det-infer: config field 'hidden_act' = {act!r} is not supported (only 'silu')")
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
        if family == "mistral" and d.get("sliding_window") is not None:
            window = _int(d, "sliding_window")
        elif family == "llama" and d.get("sliding_window"):
            raise ValueError("det-infer: config field 'sliding_window' is not supported for llama")
        eps = d.get("rms_norm_eps", 1e-6)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"det-infer: config field 'rms_norm_eps' must be a positive number, got {eps!r}")
        eos = d.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        params = rope.rope_parameters(d)
        cfg = ModelConfig(
            family=family, hidden_size=hidden, num_hidden_layers=_int(d, "num_hidden_layers"),
            num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
            intermediate_size=_int(d, "intermediate_size"), vocab_size=_int(d, "vocab_size"),
            rms_norm_eps=float(eps), tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qk_norm=family == "qwen3", sliding_window=window,
            max_position_embeddings=_int(d, "max_position_embeddings", 4096),
            rope_parameters=params, eos_token_ids=eos, bos_token_id=d.get("bos_token_id"),
            quantization=quantization)
        cfg.inv_freq()  # validates the rope settings now, with the config's error messages
        return cfg

    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rope_parameters.get("partial_rotary_factor", 1.0))

    def inv_freq(self):
        return rope.inv_freq(self.head_dim, self.rope_parameters,
                             self.rope_parameters.get("partial_rotary_factor", 1.0))

    def engine_ints(self) -> list:
        """The integer config in LLAMA_CFG_FIELDS order."""
        return [self.hidden_size, self.num_hidden_layers, self.num_attention_heads, self.num_key_value_heads,
                self.head_dim, self.intermediate_size, self.vocab_size, self.rotary_dim() // 2,
                self.sliding_window, int(self.qk_norm), int(self.tie_word_embeddings)]

    def kv_bytes_per_position(self) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 4
