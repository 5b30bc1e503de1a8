"""GGUF files of the synthetic models written with gguf-py (llama.cpp's tensor names, its Q/K
permutation, biases included, for llama-layout architectures and Gemma's 1 + w norms), each with its bf16 safetensors
twin holding the dequantized weights: tests/test_gguf.py, tests/test_fuzz_gguf.py and
scripts/fuzz_loaders.py."""
import json
import os

import numpy as np
import torch

from det_fixtures import synthetic

GGUF_ARCH = {"llama": "llama", "qwen3": "qwen3", "mistral": "mistral", "gemma3": "gemma3", "qwen2": "qwen2"}
PERMUTED = {"llama", "mistral"}


def _permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows (what from_gguf undoes)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAME = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight", "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
}


# Gemma-3's norms by place (llama.cpp's names).
GEMMA3_GGUF_NAME = {"post_attention_layernorm.weight": "post_attention_norm.weight",
                    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                    "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}


def _gguf_name(hf, family):
    table = {**GGUF_NAME, **GEMMA3_GGUF_NAME} if family == "gemma3" else GGUF_NAME
    if hf in table:
        return table[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{table[rest]}"


def gguf_twin_config(family, **changes):
    """The synthetic config (its fields updated by changes) as a GGUF expresses it: plain rope; for
    gemma3, what llama.cpp assumes (five sliding layers then a full one, sliding rope base 10000,
    scores scaled by 1/sqrt(head_dim))."""
    cfg = dict(synthetic.CONFIGS[family], **changes)
    if family != "gemma3":
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_parameters"]["rope_theta"]}
        return cfg
    n = cfg["num_hidden_layers"]
    cfg["layer_types"] = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    cfg["query_pre_attn_scalar"] = cfg["head_dim"]
    cfg["rope_parameters"] = {"full_attention": cfg["rope_parameters"]["full_attention"],
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    return cfg


def write_gguf(family, qtype_name, directory, **changes):
    """(gguf path, directory of the bf16 safetensors twin holding the dequantized weights); changes
    update the synthetic config (e.g. attention_bias=True)."""
    import gguf
    from safetensors.torch import save_file

    cfg = gguf_twin_config(family, **changes)
    rope = cfg["rope_parameters"]
    theta = (rope["full_attention"] if family == "gemma3" else rope)["rope_theta"]
    qtype = getattr(gguf.GGMLQuantizationType, qtype_name)
    arch = GGUF_ARCH[family]
    path = os.path.join(directory, f"{family}-{qtype_name}.gguf")
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(theta)
    w.add_vocab_size(cfg["vocab_size"])
    if family in ("mistral", "gemma3"):
        w.add_sliding_window(cfg["sliding_window"])
    twin = {}
    for name, t in synthetic.state_dict(family, config=cfg).items():
        a = t.float().numpy()
        if family in PERMUTED and name.endswith(("q_proj.weight", "q_proj.bias")):
            a = _permute(a, cfg["num_attention_heads"])
        elif family in PERMUTED and name.endswith(("k_proj.weight", "k_proj.bias")):
            a = _permute(a, cfg["num_key_value_heads"])
        gemma_norm = family == "gemma3" and a.ndim == 1
        if gemma_norm:
            a = a + np.float32(1.0)  # llama.cpp stores Gemma's norms as 1 + w
        if a.ndim == 1 or qtype_name == "F32":  # norms stay F32, as llama.cpp keeps them
            w.add_tensor(_gguf_name(name, family), a.astype(np.float32))
            deq = a.astype(np.float32)
        else:
            q = gguf.quants.quantize(a, qtype)
            w.add_tensor(_gguf_name(name, family), q, raw_shape=q.shape, raw_dtype=qtype)
            deq = gguf.quants.dequantize(q, qtype).reshape(a.shape)
        if gemma_norm:
            deq = deq - np.float32(1.0)
        if family in PERMUTED and name.endswith(("q_proj.weight", "q_proj.bias")):
            deq = deq.reshape(cfg["num_attention_heads"], -1, 2, *deq.shape[1:]).swapaxes(1, 2).reshape(deq.shape)
        elif family in PERMUTED and name.endswith(("k_proj.weight", "k_proj.bias")):
            deq = deq.reshape(cfg["num_key_value_heads"], -1, 2, *deq.shape[1:]).swapaxes(1, 2).reshape(deq.shape)
        twin[name] = torch.from_numpy(np.ascontiguousarray(deq, dtype=np.float32)).to(torch.bfloat16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    twin_dir = os.path.join(directory, f"{family}-{qtype_name}-twin")
    os.makedirs(twin_dir, exist_ok=True)
    with open(os.path.join(twin_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(twin, os.path.join(twin_dir, "model.safetensors"))
    return path, twin_dir
