"""Synthetic llama-family checkpoints with weights from our own seeded generator.

The bytes depend only on (seed, tensor name, shape): splitmix64 streams (contract_inputs.py) turned
into Irwin-Hall (sum of four uniform integers) values scaled by powers of two, rounded to fp32 and
then to bf16 with integer round-to-nearest-even. No torch or numpy RNG, no transcendental: the
checkpoints, and so the pinned digests, never move with a library release.
"""
import hashlib
import json
import os

import numpy as np
import torch

from det_fixtures.contract_inputs import splitmix64

# Configs deliberately use eps != 1e-6 and head_dim != hidden / heads (so a hard-coded value fails).
CONFIGS = {
    "llama": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=1000, hidden_size=128,
        intermediate_size=352, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=48, rms_norm_eps=1e-5, max_position_embeddings=2048, tie_word_embeddings=False,
        hidden_act="silu", bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 256}),
    "qwen3": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=1000, hidden_size=128,
        intermediate_size=320, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
        head_dim=64, rms_norm_eps=3e-6, max_position_embeddings=2048, tie_word_embeddings=True,
        hidden_act="silu", bos_token_id=1, eos_token_id=2, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    "mistral": dict(
        architectures=["MistralForCausalLM"], model_type="mistral", vocab_size=1000, hidden_size=160,
        intermediate_size=384, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, rms_norm_eps=1e-5, max_position_embeddings=2048, tie_word_embeddings=False,
        hidden_act="silu", bos_token_id=1, eos_token_id=2, sliding_window=40,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # Qwen2's biased q, k and v projections (o_proj has none), tied embeddings like Qwen2.5-0.5B.
    "qwen2": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=1000, hidden_size=128,
        intermediate_size=288, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=48, rms_norm_eps=2e-6, max_position_embeddings=2048, tie_word_embeddings=True,
        hidden_act="silu", bos_token_id=1, eos_token_id=2, use_sliding_window=False, sliding_window=4096,
        max_window_layers=3, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    # Gemma-3's layer pattern at a small width: sliding layers (window 40, their own rope theta)
    # around a full-attention one, query_pre_attn_scalar != head_dim, tied embeddings.
    "gemma3": dict(
        architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=1000, hidden_size=128,
        intermediate_size=320, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=48, rms_norm_eps=1e-6, max_position_embeddings=2048, tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh", bos_token_id=2, eos_token_id=1, pad_token_id=0,
        query_pre_attn_scalar=40, sliding_window=40,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        final_logit_softcapping=None, attn_logit_softcapping=None,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
    # Gemma-4's text model shaped like E2B at a small width: four sliding layers then a full one
    # (twice), full layers with twice the head size and proportional rope on a quarter of it, the
    # last four layers reading earlier layers' K/V with double-wide MLPs, per-layer inputs, a
    # softcapped head.
    "gemma4": dict(
        architectures=["Gemma4ForCausalLM"], model_type="gemma4_text", vocab_size=1000, hidden_size=128,
        intermediate_size=256, num_hidden_layers=10, num_attention_heads=4, num_key_value_heads=1,
        head_dim=32, global_head_dim=64, rms_norm_eps=1e-6, max_position_embeddings=2048,
        tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh", bos_token_id=2, eos_token_id=1,
        pad_token_id=0, sliding_window=40, layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2,
        num_kv_shared_layers=4, use_double_wide_mlp=True, hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=1000, final_logit_softcapping=30.0, attention_k_eq_v=False,
        enable_moe_block=False,
        rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
}
# Gemma-3's norms multiply by 1 + w, so its weights sit around 0 rather than 1.
_NORM_OFFSET = {"gemma3": 0.0}


def _gemma4_state_dict(c, seed):
    """Gemma-4 weights: q/k norm multipliers around 0.4 (its scores are not scaled by 1/sqrt(D),
    so multipliers near 1 make a random model chaotic), layer scalars in [0.5, 1]."""
    H, V, P, L = c["hidden_size"], c["vocab_size"], c["hidden_size_per_layer_input"], c["num_hidden_layers"]
    first_shared = L - c["num_kv_shared_layers"]
    sd = {"model.embed_tokens.weight": irwin_hall_bf16("embed", (V, H), -4, seed=seed),
          "model.norm.weight": irwin_hall_bf16("norm", (H,), -3, 1.0, seed),
          "model.embed_tokens_per_layer.weight": irwin_hall_bf16("ple_embed", (V, L * P), -4, seed=seed),
          "model.per_layer_model_projection.weight": irwin_hall_bf16("ple_proj", (L * P, H), -3, seed=seed),
          "model.per_layer_projection_norm.weight": irwin_hall_bf16("ple_norm", (P,), -3, 1.0, seed)}
    for i in range(L):
        p = f"model.layers.{i}."
        full = c["layer_types"][i] == "full_attention"
        D = c["global_head_dim"] if full else c["head_dim"]
        I = c["intermediate_size"] * (2 if i >= first_shared else 1)
        QD, KVD = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
        shapes = {"self_attn.q_proj.weight": (QD, H), "self_attn.o_proj.weight": (H, QD),
                  "mlp.gate_proj.weight": (I, H), "mlp.up_proj.weight": (I, H), "mlp.down_proj.weight": (H, I),
                  "per_layer_input_gate.weight": (P, H), "per_layer_projection.weight": (H, P)}
        norms = {"self_attn.q_norm.weight": D, "input_layernorm.weight": H, "post_attention_layernorm.weight": H,
                 "pre_feedforward_layernorm.weight": H, "post_feedforward_layernorm.weight": H,
                 "post_per_layer_input_norm.weight": H}
        if i < first_shared:
            shapes.update({"self_attn.k_proj.weight": (KVD, H), "self_attn.v_proj.weight": (KVD, H)})
            norms["self_attn.k_norm.weight"] = D
        for n, shape in shapes.items():
            sd[p + n] = irwin_hall_bf16(p + n, shape, -2, seed=seed)
        for n, size in norms.items():
            qk = n.startswith("self_attn")
            sd[p + n] = irwin_hall_bf16(p + n, (size,), -3, 0.4 if qk else 1.0, seed)
        sd[p + "layer_scalar"] = irwin_hall_bf16(p + "layer_scalar", (1,), -2, 0.75, seed)
        if c.get("attention_bias"):  # q and o on every layer, k and v where the layer has its own
            own = i < first_shared
            for n, size in (("q", QD), ("o", H)) + ((("k", KVD), ("v", KVD)) if own else ()):
                sd[f"{p}self_attn.{n}_proj.bias"] = irwin_hall_bf16(f"{p}self_attn.{n}_proj.bias", (size,), -3,
                                                                    seed=seed)
    return sd


def _seed(name, seed):
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")


def irwin_hall_bf16(name, shape, log2_scale, offset=0.0, seed=0):
    """bf16 tensor: offset + (sum of four 20-bit uniforms - 2^21) * 2^(log2_scale - 21).
    Standard deviation ~ 0.289 * 2^log2_scale."""
    n = int(np.prod(shape))
    u = splitmix64(_seed(name, seed), n)
    parts = [(u >> np.uint64(s)) & np.uint64(0xFFFFF) for s in (0, 20, 40)]
    parts.append((u >> np.uint64(44)) & np.uint64(0xFFFFF))
    ints = sum(p.astype(np.int64) for p in parts) - (1 << 21)
    f32 = (offset + ints.astype(np.float64) * 2.0 ** (log2_scale - 21)).astype(np.float32)
    bits = f32.view(np.uint32).astype(np.uint64)
    bits = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return torch.from_numpy(bits.astype(np.uint16).view(np.int16).reshape(shape).copy()).view(torch.bfloat16)


def state_dict(family, seed=0, config=None):
    """The family's weights; config (default CONFIGS[family]) may change its shapes."""
    c = config or CONFIGS[family]
    if c["model_type"] == "gemma4_text":
        return _gemma4_state_dict(c, seed)
    H, D, I, V = c["hidden_size"], c["head_dim"], c["intermediate_size"], c["vocab_size"]
    QD, KVD = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    one = _NORM_OFFSET.get(family, 1.0)
    sd = {"model.embed_tokens.weight": irwin_hall_bf16("embed", (V, H), -4 if family == "gemma3" else -1, seed=seed),
          "model.norm.weight": irwin_hall_bf16("norm", (H,), -3, one, seed)}
    if not c["tie_word_embeddings"]:
        sd["lm_head.weight"] = irwin_hall_bf16("lm_head", (V, H), -2, seed=seed)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj.weight": (QD, H), "self_attn.k_proj.weight": (KVD, H),
                  "self_attn.v_proj.weight": (KVD, H), "self_attn.o_proj.weight": (H, QD),
                  "mlp.gate_proj.weight": (I, H), "mlp.up_proj.weight": (I, H), "mlp.down_proj.weight": (H, I)}
        for n, shape in shapes.items():
            sd[p + n] = irwin_hall_bf16(p + n, shape, -2, seed=seed)
        norms = ["input_layernorm.weight", "post_attention_layernorm.weight"]
        if family == "gemma3":
            norms += ["pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"]
        for n in norms:
            sd[p + n] = irwin_hall_bf16(p + n, (H,), -3, one, seed)
        if family in ("qwen3", "gemma3"):
            for n in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"):
                sd[p + n] = irwin_hall_bf16(p + n, (D,), -3, one, seed)
        biased = (("q", QD), ("k", KVD), ("v", KVD)) if family == "qwen2" else ()
        if c.get("attention_bias"):
            biased = (("q", QD), ("k", KVD), ("v", KVD), ("o", H))
        for n, size in biased:  # k's the largest, as in the released Qwen2 models
            name = f"{p}self_attn.{n}_proj.bias"
            sd[name] = irwin_hall_bf16(name, (size,), 1 if n == "k" else -1, seed=seed)
    return sd


def write_checkpoint(family, directory, seed=0, **changes):
    """config.json + model.safetensors for a synthetic model, its config fields updated by changes
    (a variant of the family: other sizes); returns the directory."""
    from safetensors.torch import save_file

    config = dict(CONFIGS[family], **changes)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    save_file(state_dict(family, seed, config), os.path.join(directory, "model.safetensors"))
    return directory


def token_sequence(n, vocab, seed):
    """A fixed pseudo-random token sequence (avoiding ids 0..2)."""
    return [int(3 + v % (vocab - 3)) for v in splitmix64(seed, n)]


BYTE_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3, then the 256 byte-level symbols: 260 in all


def write_byte_tokenizer(directory):
    """A byte-level tokenizer (one token per UTF-8 byte, no merges) with a small chat template, saved
    as a Hugging Face tokenizer in directory: text for a synthetic model with vocab_size 260 (bos 1,
    eos 2, as CONFIGS), with no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = BYTE_TOKENS + sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                  pad_token="<pad>")
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    tok.save_pretrained(str(directory))
    return directory


def write_byte_model(directory, seed=0, **changes):
    """A synthetic Llama whose vocabulary is the byte-level tokenizer's (write_byte_tokenizer), with
    that tokenizer beside it: a model that reads and writes text, fast on every executor."""
    write_checkpoint("llama", directory, seed=seed, vocab_size=len(BYTE_TOKENS) + 256, **changes)
    return write_byte_tokenizer(directory)
