"""MegaModel's API around the certificate: loading (sharded, tied, converted dtypes, zero copy),
unsupported configs, stop on eos, state reset and fork, and clear errors for bad input."""
import json
import os
import sys
from pathlib import Path

import pytest
from det_fixtures import synthetic
import torch


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return synthetic.write_checkpoint("llama", str(tmp_path_factory.mktemp("m") / "llama"))


@pytest.fixture(scope="module")
def mm(di, llama_dir):
    return di.MegaModel.from_pretrained(llama_dir, max_context=256)


def _variant(tmp_path, edit_config=None, edit_tensors=None, family="llama"):
    from safetensors.torch import save_file

    cfg = json.loads(json.dumps(synthetic.CONFIGS[family]))
    sd = synthetic.state_dict(family)
    if edit_config:
        edit_config(cfg)
    if edit_tensors:
        edit_tensors(sd)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(sd, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_weights_are_used_in_place(mm, llama_dir):
    """bf16 checkpoint tensors are not copied: every bf16 engine weight is a view of one file
    mapping. Only the norms' fp32 multipliers (docs/SPEC.md §13.2) are made at load: hidden-size
    vectors, a few KiB."""
    bf16 = [w for w in mm._weights if w.dtype == torch.bfloat16]
    norms = [w for w in mm._weights if w.dtype == torch.float32]
    assert len(bf16) + len(norms) == len(mm._weights) and all(w.dim() == 1 for w in norms)
    assert len({w.untyped_storage().data_ptr() for w in bf16}) == 1
    assert bf16[0].untyped_storage().nbytes() == os.path.getsize(os.path.join(llama_dir, "model.safetensors"))
    assert sum(w.numel() * 4 for w in norms) < 16 * 1024


def test_sharded_checkpoint_gives_the_same_logits(di, mm, tmp_path):
    from safetensors.torch import save_file

    sd = synthetic.state_dict("llama")
    names = sorted(sd)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for fname, keys in shards.items():
        save_file({k: sd[k] for k in keys}, str(tmp_path / fname))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: f for f, ks in shards.items() for k in ks}}))
    (tmp_path / "config.json").write_text(json.dumps(synthetic.CONFIGS["llama"]))
    sharded = di.MegaModel.from_pretrained(tmp_path, max_context=256)
    ids = synthetic.token_sequence(20, 1000, 3)
    assert torch.equal(sharded.teacher_forced_logits(ids), mm.teacher_forced_logits(ids))


def test_fp32_checkpoint_is_rounded_to_bf16(di, mm, tmp_path):
    d = _variant(tmp_path, edit_tensors=lambda sd: sd.update({k: v.float() for k, v in sd.items()}))
    ids = synthetic.token_sequence(20, 1000, 3)
    assert torch.equal(di.MegaModel.from_pretrained(d).teacher_forced_logits(ids), mm.teacher_forced_logits(ids))


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda c: c.update(hidden_act="gelu"), "'hidden_act' = 'gelu'"),
        # attention_bias is supported (tests/test_qwen2.py); a checkpoint without the biases names them
        (lambda c: c.update(attention_bias=True), r"lacks 12 tensors .*'model.layers.0.self_attn.q_proj.bias'"),
        (lambda c: c.update(attention_bias="yes"), "'attention_bias' must be true or false"),
        (lambda c: c.update(mlp_bias=True), "'mlp_bias'"),
        (lambda c: c.update(architectures=["GPT2LMHeadModel"]), "unsupported architecture"),
        (lambda c: c["rope_parameters"].update(rope_type="yarn"), "unsupported rope type 'yarn'"),
        (lambda c: c.update(num_key_value_heads=3), "not a multiple"),
        (lambda c: c.update(hidden_size=-5), "'hidden_size' must be >= 1"),
        (lambda c: c.update(quantization_config={"quant_method": "bitsandbytes"}), "quantization_config"),
        (lambda c: c.update(sliding_window=16), "'sliding_window' is not supported for llama"),
    ],
)
def test_unsupported_config_is_a_clear_error(di, tmp_path, edit, message):
    d = _variant(tmp_path, edit_config=edit)
    with pytest.raises(ValueError, match=message):
        di.MegaModel.from_pretrained(d)


def test_missing_and_unexpected_tensors_are_named(di, tmp_path):
    d = _variant(tmp_path, edit_tensors=lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
        di.MegaModel.from_pretrained(d)
    d = _variant(tmp_path, edit_tensors=lambda sd: sd.update({"model.layers.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match="model.layers.0.extra.weight"):
        di.MegaModel.from_pretrained(d)
    d = _variant(tmp_path, edit_tensors=lambda sd: sd.update(
        {"model.norm.weight": torch.ones(7, dtype=torch.bfloat16)}))
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(7,\), expected \(128,\)"):
        di.MegaModel.from_pretrained(d)


def test_missing_directory_and_offline_hub_id(di, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="no model directory"):
        di.MegaModel.from_pretrained(str(tmp_path / "nope" / "deeper"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="could not fetch 'someone/some-model'"):
        di.MegaModel.from_pretrained("someone/some-model")


def test_unavailable_or_unknown_device_is_refused(di, llama_dir):
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda' needs a CUDA build of torch and a GPU"):
            di.MegaModel.from_pretrained(llama_dir, device="cuda")
    with pytest.raises(ValueError, match="device 'meta' is not supported; supported: 'cpu', 'cuda'"):
        di.MegaModel.from_pretrained(llama_dir, device="meta")
    with pytest.raises(ValueError, match="is not a device"):
        di.MegaModel.from_pretrained(llama_dir, device="gpu0")


def test_stop_on_eos(mm):
    prompt = synthetic.token_sequence(30, 1000, 12)
    full = mm.generate(prompt, max_new=20)
    stop = full[5]
    cut = mm.generate(prompt, max_new=20, stop_ids=[stop])
    assert cut == full[: full.index(stop) + 1]
    assert mm.generate(prompt, max_new=20, stop_ids=[stop], single_launch=False) == cut
    streams = mm.generate_batch([prompt, prompt[:10]], max_new=20, stop_ids=[stop])
    assert streams[0] == cut


def test_decode_rule_is_the_executors_rule(di):
    # det_decode_continues (model/det_program.h), as the per-step path calls it.
    stops = torch.tensor([7, 3], dtype=torch.int32)
    assert di.ops.decode_continues(5, 0, 4, stops)
    assert not di.ops.decode_continues(3, 0, 4, stops)  # a stop id
    assert not di.ops.decode_continues(5, 3, 4, stops)  # the max_new-th token
    assert di.ops.decode_continues(5, 2, 4, torch.empty(0, dtype=torch.int32))
    with pytest.raises(ValueError, match="max_new >= 1"):
        di.ops.decode_continues(5, 0, 0, stops)


def test_tokenizer_output_is_accepted_as_ids(mm):
    """What a tokenizer returns (a BatchEncoding, a dict with input_ids) is taken as its input_ids."""
    prompt = synthetic.token_sequence(12, 1000, 4)
    want = mm.generate(prompt, max_new=3)
    assert mm.generate({"input_ids": prompt, "attention_mask": [1] * 12}, max_new=3) == want
    assert mm.generate({"input_ids": torch.tensor(prompt)}, max_new=3) == want
    with pytest.raises(TypeError, match="1-d integer"):
        mm.generate({"input_ids": torch.tensor([prompt])}, max_new=3)


def test_reset_and_fork(mm):
    ids = synthetic.token_sequence(40, 1000, 5)
    mm.reset()
    mm.prefill(ids[:30])
    twin = mm.fork()
    a = mm.decode_step(ids[30], 30)
    b = mm.decode_step(ids[30], 30, twin)
    assert torch.equal(a, b)
    mm.decode_step(7, 31)            # the default state moves on ...
    c = mm.decode_step(ids[31], 31, twin)  # ... the fork does not see it
    assert torch.equal(c, mm.teacher_forced_logits(ids[:32])[31])
    # decoding at an earlier position rewinds: same logits as the first time
    assert torch.equal(mm.decode_step(ids[30], 30), a)


def test_stop_ids_may_be_a_list_or_an_integer_tensor(mm):
    ids = synthetic.token_sequence(10, 1000, 9)
    free = mm.generate(ids, max_new=6)
    stop = free[2]
    cut = free[:free.index(stop) + 1]
    assert mm.generate(ids, max_new=6, stop_ids=[stop]) == cut
    assert mm.generate(ids, max_new=6, stop_ids=torch.tensor([stop])) == cut
    assert mm.generate([torch.tensor(t) for t in ids], max_new=6) == free  # 0-d integer tensors are ids


@pytest.mark.parametrize(
    "call,exc,message",
    [
        (lambda m: m.generate([], max_new=4), ValueError, "empty"),
        (lambda m: m.generate([1000], max_new=4), ValueError, r"outside the vocabulary \[0, 1000\)"),
        (lambda m: m.generate([-1], max_new=4), ValueError, "outside the vocabulary"),
        (lambda m: m.generate([1, 2], max_new=0), ValueError, "max_new must be a positive int"),
        (lambda m: m.generate([1, 2], max_new=300), ValueError, "exceed max_context 256"),
        (lambda m: m.generate("hello", max_new=4), TypeError, "sequence of token ids, not a string"),
        (lambda m: m.generate([5, 2.7], max_new=4), TypeError, r"integer token ids, got 2.7 \(float\)"),
        (lambda m: m.generate([5, True], max_new=4), TypeError, "integer token ids, got True"),
        (lambda m: m.generate([5], max_new=4, stop_ids=[1.5]), TypeError, "stop_ids must be integer token ids"),
        (lambda m: m.generate([5, torch.tensor(2.0)], max_new=4), TypeError, "integer token ids"),
        (lambda m: m.generate(torch.ones(2, 2, dtype=torch.int64), max_new=4), TypeError, "1-d integer"),
        (lambda m: m.generate_batch([[1]] * 17, max_new=4), ValueError, "1..16 prompts"),
        (lambda m: m.decode_step(5, 3, m.new_state(8)), ValueError, "positions 0..-1 are filled"),
        (lambda m: m.decode_step(5, -1), ValueError, "cannot be decoded"),
        (lambda m: m.decode_step(5, 1.5), TypeError, "pos must be an int"),
        (lambda m: m.decode_step(10**6, 0), ValueError, "outside the vocabulary"),
        (lambda m: m.extend([1] * 9, m.new_state(8)), ValueError, "do not fit"),
        (lambda m: m.new_state(10**9), ValueError, "exceed max_context"),
        (lambda m: m.new_state(0), ValueError, "capacity must be a positive int"),
    ],
)
def test_bad_input_is_a_clear_error_and_the_model_stays_usable(mm, call, exc, message):
    ids = synthetic.token_sequence(10, 1000, 9)
    before = mm.teacher_forced_logits(ids)
    with pytest.raises(exc, match=message):
        call(mm)
    assert torch.equal(mm.teacher_forced_logits(ids), before)


def test_raw_op_validates_its_arguments(di, mm):
    logits = torch.empty((1, 1000))
    state = mm.new_state(8)
    args = lambda tok, pos: (mm._native, torch.tensor([tok], dtype=torch.int32), torch.tensor([pos]), [state.cache],
                             torch.tensor([0]), torch.tensor([1], dtype=torch.uint8), logits)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        di.ops.mak_forward(*args(1000, 0))
    with pytest.raises(ValueError, match="outside the KV cache capacity"):
        di.ops.mak_forward(*args(5, 8))
    two = (mm._native, torch.tensor([5, 6], dtype=torch.int32), torch.tensor([1, 0]), [state.cache],
           torch.tensor([0, 0]), torch.tensor([1, 1], dtype=torch.uint8), torch.empty((2, 1000)))
    with pytest.raises(ValueError, match="increasing position order"):
        di.ops.mak_forward(*two)


def test_native_model_binds_weights_by_name(di, mm):
    """The weights reach the native side once, by checkpoint name: their order does not matter, and
    a missing, extra, repeated or mistyped tensor is refused by name."""
    names, w = di.names.llama_tensor_names(mm.config), mm._weights
    build = lambda n, t: di.model.native_model(n, t, [], mm._cfg_ints, mm.config.rms_norm_eps, mm._inv_freq)
    ids = synthetic.token_sequence(12, 1000, 3)
    shuffled = list(range(len(w)))[::-1]
    mm_native = mm._native
    try:
        mm._native = build([names[i] for i in shuffled], [w[i] for i in shuffled])
        reversed_order = mm.teacher_forced_logits(ids)
    finally:
        mm._native = mm_native
    assert torch.equal(reversed_order, mm.teacher_forced_logits(ids))
    with pytest.raises(ValueError, match=r"needs tensor model.layers.2.mlp.down_proj.weight, which was not given"):
        build(names[:-1], w[:-1])
    with pytest.raises(ValueError, match="tensor extra.weight is not used by this config"):
        build(names + ["extra.weight"], w + [w[-1]])
    with pytest.raises(ValueError, match="is given twice"):
        build(names + [names[0]], w + [w[0]])
    q = names.index("model.layers.0.self_attn.q_proj.weight")
    with pytest.raises(TypeError, match="self_attn.q_proj.weight must be bfloat16"):
        build(names, [t.float() if i == q else t for i, t in enumerate(w)])
    norm = names.index("model.layers.0.input_layernorm.weight")
    with pytest.raises(TypeError, match="input_layernorm.weight must be float32"):
        build(names, [t.bfloat16() if i == norm else t for i, t in enumerate(w)])


def test_config_field_table_is_the_same_in_python_and_cpp(di):
    """config.py's LLAMA_CFG_FIELDS / ROPE_TABLE_FIELDS / LAYER_FIELDS are the names of
    det_model_cfg.h's DET_CFG_FIELDS / DET_CFG_TABLE_FIELDS / DET_CFG_LAYER_FIELDS, in order, and
    engine_ints has exactly that length for a model with two rope tables."""
    import re

    header = (Path(__file__).resolve().parent.parent / "model" / "det_model_cfg.h").read_text()

    def names(macro):
        body = re.search(rf"#define {macro}\(X\)(.*?)(?<!\\)\n", header, re.S).group(1)
        return tuple(re.findall(r'X\(\w+, "(\w+)"\)', body))

    config = sys.modules[di.ModelConfig.__module__]
    assert names("DET_CFG_FIELDS") == config.LLAMA_CFG_FIELDS
    assert names("DET_CFG_TABLE_FIELDS") == config.ROPE_TABLE_FIELDS
    assert names("DET_CFG_LAYER_FIELDS") == config.LAYER_FIELDS
    cfg = di.ModelConfig.from_dict(synthetic.CONFIGS["gemma3"])
    assert len(cfg.engine_ints()) == (len(config.LLAMA_CFG_FIELDS) + 2 * len(config.ROPE_TABLE_FIELDS)
                                      + cfg.num_hidden_layers * len(config.LAYER_FIELDS))
