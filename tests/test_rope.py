"""Rope inverse-frequency tables (torch-ext/det_infer/rope.py): exact against mpmath at 60 digits,
consistent with transformers' own (fp32) definitions, and pinned byte for byte."""
import hashlib

import mpmath
import pytest
import torch

# Tables for configs of real models. Pinned after checking every entry against mpmath (below).
CASES = {
    "smollm2-135m": ({"rope_type": "default", "rope_theta": 100000.0}, 64, 1.0),
    "llama-3.2-1b": ({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, 64, 1.0),
    "qwen3-0.6b": ({"rope_type": "default", "rope_theta": 1000000}, 128, 1.0),
    "linear-x4-partial": ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, 128, 0.5),
}
PINNED_SHA256 = {
    "smollm2-135m": "692a8b3fb6e50ac6d41c10e31493bbe7c83141b17a3347dcd043b5edda24d836",
    "llama-3.2-1b": "b1478355e371d6ddcf1fffcaafa541fcec3d93f6a18e0bb0b8c72382a6887065",
    "qwen3-0.6b": "fe4910e5cd2a70e3ea1b43fa1ccb3b7b59d755e793039cc235349dd6ec0bfdb9",
    "linear-x4-partial": "ad766ebd84b728f63af480b2f953feb5cd576a92f9348b775cc6eb1a5fb2e3f2",
}


def _mp_table(params, head_dim, partial):
    """The same recipe in mpmath at 60 digits (an independent implementation)."""
    with mpmath.workdps(60):
        dim = int(head_dim * partial)
        theta = mpmath.mpf(repr(float(params["rope_theta"])))
        freqs = [theta ** (-mpmath.mpf(2 * i) / dim) for i in range(dim // 2)]
        kind = params["rope_type"]
        if kind == "linear":
            freqs = [f / mpmath.mpf(repr(params["factor"])) for f in freqs]
        elif kind == "llama3":
            factor, low, high = (mpmath.mpf(repr(params[k])) for k in ("factor", "low_freq_factor", "high_freq_factor"))
            old = mpmath.mpf(params["original_max_position_embeddings"])
            out = []
            for f in freqs:
                wavelen = 2 * mpmath.pi / f
                if wavelen < old / high:
                    out.append(f)
                elif wavelen > old / low:
                    out.append(f / factor)
                else:
                    s = (old / wavelen - low) / (high - low)
                    out.append((1 - s) * f / factor + s * f)
            freqs = out
        return [float(f) for f in freqs]


@pytest.mark.parametrize("name", sorted(CASES))
def test_table_is_exact_and_pinned(di, name):
    params, head_dim, partial = CASES[name]
    table = di.rope.inv_freq(head_dim, params, partial)
    assert table.dtype == torch.float64 and table.shape == (int(head_dim * partial) // 2,)
    assert table.tolist() == _mp_table(params, head_dim, partial)
    assert hashlib.sha256(table.numpy().tobytes()).hexdigest() == PINNED_SHA256[name]


def _transformers_table(params, head_dim, partial):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = dict(params, partial_rotary_factor=partial)
    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                      rope_parameters=rope)
    if params["rope_type"] == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)[0]
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu")[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_table_agrees_with_transformers(di, name):
    """transformers computes the same definition in fp32 (a pow, a division, the smoothing): its
    values sit within a few fp32 ulps of the exact ones."""
    params, head_dim, partial = CASES[name]
    ours = di.rope.inv_freq(head_dim, params, partial)
    theirs = _transformers_table(params, head_dim, partial).double()
    assert theirs.shape == ours.shape
    rel = ((theirs - ours).abs() / ours).max().item()
    assert rel < 4 * 2.0**-24, rel


def test_from_config_reads_both_config_styles(di):
    new_style = {"hidden_size": 576, "num_attention_heads": 9,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}}
    old_style = {"hidden_size": 576, "num_attention_heads": 9, "rope_theta": 100000.0, "rope_scaling": None}
    a, b = di.rope.inv_freq_from_config(new_style), di.rope.inv_freq_from_config(old_style)
    assert torch.equal(a, b) and a.shape == (32,)
    legacy = {"hidden_size": 2048, "num_attention_heads": 32, "rope_theta": 500000.0,
              "rope_scaling": {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    params, head_dim, _ = CASES["llama-3.2-1b"]
    assert torch.equal(di.rope.inv_freq_from_config(legacy), di.rope.inv_freq(head_dim, params))


@pytest.mark.parametrize(
    "params,head_dim,partial,message",
    [
        ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}, 64, 1.0, "unsupported rope type 'yarn'"),
        ({"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}, 64, 1.0, "needs 'low_freq_factor'"),
        ({"rope_type": "default", "rope_theta": -1.0}, 64, 1.0, "positive finite"),
        ({"rope_type": "default", "rope_theta": "big"}, 64, 1.0, "must be a number"),
        ({"rope_type": "default", "rope_theta": 1e4}, 63, 1.0, "must be even"),
        ({"rope_type": "default", "rope_theta": 1e4}, 0, 1.0, "positive int"),
        ({"rope_type": "default", "rope_theta": 1e4}, 64, 1.5, r"in \(0, 1\]"),
    ],
)
def test_bad_rope_parameters(di, params, head_dim, partial, message):
    with pytest.raises((ValueError, TypeError), match=message):
        di.rope.inv_freq(head_dim, params, partial)


def test_missing_rope_theta(di):
    with pytest.raises(ValueError, match="no rope_theta"):
        di.rope.inv_freq_from_config({"hidden_size": 64, "num_attention_heads": 1})
