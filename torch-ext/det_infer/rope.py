"""Rope inverse-frequency tables in exact arithmetic, rounded once to fp64 (docs/SPEC.md §7.2).

No host math library touches these numbers: theta^(-2i/d) is exp(-(2i/d) * ln theta) in Python's
decimal module at 50 significant digits (its ln and exp are correctly rounded to the context),
llama3 wavelength scaling runs on fractions.Fraction, and each entry is rounded to fp64 once at
the end. The result is a pure function of the config, identical on every machine.
"""
from decimal import Context, Decimal
from fractions import Fraction

import torch

DIGITS = 50
_CTX = Context(prec=DIGITS)
# pi to 60 significant digits; the 50-digit context rounds it on use.
_PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494")

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "proportional")


def _exact(value, name):
    """A config number as an exact Decimal: ints exactly, floats through their shortest repr
    (the literal written in config.json)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"det-infer: rope parameter {name} must be a number, got {value!r}")
    d = Decimal(value) if isinstance(value, int) else Decimal(repr(float(value)))
    if not d.is_finite() or d <= 0:
        raise ValueError(f"det-infer: rope parameter {name} must be a positive finite number, got {value!r}")
    return d


def _base_freqs(theta, dim):
    """theta^(-2i/dim) for i < dim/2 as 50-digit Decimals."""
    ln_theta = _exact(theta, "rope_theta").ln(_CTX)
    return [_CTX.exp(_CTX.multiply(Decimal(-2 * i) / Decimal(dim), ln_theta)) for i in range(dim // 2)]


def _llama3(freqs, params):
    def get(key):
        if key not in params:
            raise ValueError(f"det-infer: llama3 rope scaling needs {key!r} (got keys {sorted(params)})")
        return Fraction(_exact(params[key], key))

    factor, low, high = get("factor"), get("low_freq_factor"), get("high_freq_factor")
    old_ctx = get("original_max_position_embeddings")
    if high <= low:
        raise ValueError("det-infer: llama3 rope scaling needs high_freq_factor > low_freq_factor")
    two_pi = 2 * Fraction(_PI)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for f in map(Fraction, freqs):
        wavelen = two_pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def rope_parameters(config: dict) -> dict:
    """The rope settings of a Hugging Face config dict, in one shape: {"rope_type", "rope_theta",
    ...scaling keys}. Accepts transformers 5's `rope_parameters` and the older `rope_theta` +
    `rope_scaling` fields."""
    params = dict(config.get("rope_parameters") or {})
    scaling = config.get("rope_scaling") or {}
    for key, value in scaling.items():
        params.setdefault(key, value)
    if "rope_type" not in params:
        params["rope_type"] = params.pop("type", "default")
    if "rope_theta" not in params:
        if "rope_theta" not in config:
            raise ValueError("det-infer: config has no rope_theta (nor rope_parameters.rope_theta)")
        params["rope_theta"] = config["rope_theta"]
    return params


def inv_freq(head_dim: int, params: dict, partial_rotary_factor: float = 1.0) -> torch.Tensor:
    """The fp64 inverse frequencies, shape (rotary_dim // 2,), for one attention head.

    params: {"rope_type": "default" | "linear" | "llama3", "rope_theta": ..., scaling keys}.
    rotary_dim = int(head_dim * partial_rotary_factor), as transformers computes it."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ValueError(f"det-infer: head_dim must be a positive int, got {head_dim!r}")
    if not 0.0 < partial_rotary_factor <= 1.0:
        raise ValueError(f"det-infer: partial_rotary_factor must be in (0, 1], got {partial_rotary_factor!r}")
    dim = int(head_dim * partial_rotary_factor)
    if dim < 2 or dim % 2:
        raise ValueError(f"det-infer: the rotary dimension {dim} (head_dim {head_dim} x "
                         f"{partial_rotary_factor}) must be even and at least 2")
    rope_type = params.get("rope_type", "default")
    if rope_type == "proportional":
        # Gemma-4's full layers: the first int(partial_rotary_factor * head_dim // 2) frequencies of a
        # full-width table (exponent over head_dim, not the rotary width), divided by the optional
        # factor.
        # The pairs rotate (x_i, x_{i + head_dim/2}) (pair_offset).
        pairs = int(partial_rotary_factor * head_dim // 2)
        if pairs < 1:
            raise ValueError(f"det-infer: proportional rope on head_dim {head_dim} x {partial_rotary_factor} "
                             "rotates no pair")
        factor = Fraction(_exact(params.get("factor", 1.0), "factor"))
        freqs = _base_freqs(params.get("rope_theta"), head_dim)[:pairs]
        return torch.tensor([float(Fraction(f) / factor) for f in freqs], dtype=torch.float64)
    freqs = _base_freqs(params.get("rope_theta"), dim)
    if rope_type == "default":
        exact = [Fraction(f) for f in freqs]
    elif rope_type == "linear":
        factor = Fraction(_exact(params.get("factor"), "factor"))
        exact = [Fraction(f) / factor for f in freqs]
    elif rope_type == "llama3":
        exact = _llama3(freqs, params)
    else:
        raise ValueError(f"det-infer: unsupported rope type {rope_type!r}; supported: "
                         f"{', '.join(SUPPORTED_ROPE_TYPES)}")
    # float(Fraction) is the correctly rounded fp64 value: the one rounding of the recipe.
    return torch.tensor([float(f) for f in exact], dtype=torch.float64)


def pair_offset(head_dim: int, params: dict, pairs: int) -> int:
    """How far apart the two elements of a rotated pair are: the table's length (rotate-half over
    the rotary dimensions), or head_dim/2 for proportional rope (rotate-half over the whole head)."""
    return head_dim // 2 if params.get("rope_type") == "proportional" else pairs


def inv_freq_from_config(config: dict) -> torch.Tensor:
    """inv_freq for a Hugging Face config dict (head_dim defaults to hidden_size // heads)."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    params = rope_parameters(config)
    factor = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    return inv_freq(head_dim, params, factor)
