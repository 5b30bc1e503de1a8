"""MegaModel.update_weights: new weights by checkpoint name, equal bit for bit to a fresh load of
them after several updates, all or nothing, never a view of the caller's tensors, and a clear error
where it does not apply (nf4, GGUF, a stale KV state, a certificate of the files)."""
import nf4_checkpoints
import pytest
import torch
from det_fixtures import synthetic
from det_fixtures.gguf_files import write_gguf

IDS = synthetic.token_sequence(40, 1000, 3)


def _fresh(di, tmp_path, family, sd, tag, **kw):
    """A fresh load of config + sd (the reference the updated model must equal)."""
    from safetensors.torch import save_file

    d = synthetic.write_checkpoint(family, str(tmp_path / tag))
    save_file({k: v.contiguous() for k, v in sd.items()}, f"{d}/model.safetensors")
    return di.MegaModel.from_pretrained(d, max_context=128, **kw)


def _bits(t):
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("family,executor", [("qwen2", "engine"), ("gemma3", "engine"), ("qwen2", "emulated")])
def test_updates_equal_a_fresh_load(di, tmp_path, family, executor):
    """Three updates in a row (a whole fp32 state dict, a bf16 subset, an fp16 subset): after each,
    the logits and a generation equal a fresh load of the weights given so far (Gemma-3: its norms'
    1 + w is applied as at load)."""
    geometry = {"grid": 2, "warps": 3, "tile_rows": 4} if executor == "emulated" else None
    d = synthetic.write_checkpoint(family, str(tmp_path / "base"))
    mm = di.MegaModel.from_pretrained(d, max_context=128, executor=executor, geometry=geometry)
    base = mm.teacher_forced_logits(IDS)
    current = synthetic.state_dict(family)
    one, two = synthetic.state_dict(family, seed=1), synthetic.state_dict(family, seed=2)
    subset = [n for n in two if ".1." in n or n.endswith(("bias", "norm.weight"))]
    steps = [{n: t.float() for n, t in one.items()},                # every tensor, as fp32
             {n: two[n] for n in subset},                          # some, as bf16
             {n: (one[n].float() * 0.5).half() for n in subset[:4]}]  # fewer, as fp16
    for i, update in enumerate(steps):
        mm.update_weights(update)
        current.update({n: t.to(torch.bfloat16) for n, t in update.items()})
        fresh = _fresh(di, tmp_path, family, current, f"fresh{i}", executor=executor, geometry=geometry)
        got = mm.teacher_forced_logits(IDS)
        assert torch.equal(_bits(got), _bits(fresh.teacher_forced_logits(IDS)))
        assert not torch.equal(got, base)
        assert mm.generate(IDS[:10], max_new=6) == fresh.generate(IDS[:10], max_new=6)
    assert mm.weights_version == 3


@pytest.fixture
def qwen2(di, tmp_path):
    d = synthetic.write_checkpoint("qwen2", str(tmp_path / "q"))
    return di.MegaModel.from_pretrained(d, max_context=128)


@pytest.mark.parametrize("bad,message", [
    ({"model.layers.0.mlp.up_proj.weight": torch.zeros(288, 127)}, r"shape \(288, 127\), expected \(288, 128\)"),
    ({"model.layers.9.mlp.up_proj.weight": torch.zeros(288, 128)}, "'model.layers.9.mlp.up_proj.weight' is not a weight"),
    ({"model.layers.0.self_attn.o_proj.bias": torch.zeros(128)}, "'model.layers.0.self_attn.o_proj.bias' is not a weight"),
    ({"model.norm.weight": torch.zeros(128, dtype=torch.int32)}, "dtype torch.int32"),
    ({"model.norm.weight": [1.0] * 128}, "must be a torch.Tensor"),
    ({"lm_head.weight": torch.zeros(1000, 128)}, "ties them"),
])
def test_a_failed_update_changes_nothing(qwen2, bad, message):
    """Good tensors first, the bad one last: the error names it and the old weights stay."""
    before = qwen2.teacher_forced_logits(IDS)
    good = {n: t for n, t in synthetic.state_dict("qwen2", seed=1).items() if "layers.2" in n}
    with pytest.raises((ValueError, TypeError), match=message):
        qwen2.update_weights({**good, **bad})
    assert torch.equal(_bits(qwen2.teacher_forced_logits(IDS)), _bits(before))
    assert qwen2.weights_version == 0


def test_not_a_mapping_is_a_type_error(qwen2):
    with pytest.raises(TypeError, match="mapping of checkpoint names to tensors"):
        qwen2.update_weights([torch.zeros(3)])


def test_the_model_keeps_its_own_copy(qwen2):
    """An optimizer changing the trainer's tensors after the update does not reach the model."""
    new = synthetic.state_dict("qwen2", seed=1)
    mine = {n: t.clone() for n, t in new.items() if "layers.0" in n}
    qwen2.update_weights(mine)
    after = qwen2.teacher_forced_logits(IDS)
    for t in mine.values():
        t.add_(1.0)
    assert torch.equal(_bits(qwen2.teacher_forced_logits(IDS)), _bits(after))


def test_tied_head_equal_to_the_embedding_and_rotary_buffers_are_accepted(di, qwen2, tmp_path):
    """A tied model's state_dict() has lm_head.weight (the embedding) and may have rotary buffers:
    both are taken and ignored, and the result is a fresh load of the rest."""
    sd = synthetic.state_dict("qwen2", seed=1)
    fresh = _fresh(di, tmp_path, "qwen2", sd, "fresh")
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].float()
    sd["model.rotary_emb.inv_freq"] = torch.ones(24)
    qwen2.update_weights(sd)
    assert qwen2.weights_version == 1
    assert torch.equal(_bits(qwen2.teacher_forced_logits(IDS)), _bits(fresh.teacher_forced_logits(IDS)))
    qwen2.update_weights({"model.rotary_emb.inv_freq": torch.ones(24)})  # nothing to change: no new version
    assert qwen2.weights_version == 1 and qwen2.weights_updated


def test_gemma4_update_equals_a_fresh_load(di, tmp_path):
    """Gemma-4: layer scalars, the made-here entries (the weightless v norm, the softcap) kept, and
    the KV-sharing layers' absent k/v names refused."""
    d = synthetic.write_checkpoint("gemma4", str(tmp_path / "g"))
    mm = di.MegaModel.from_pretrained(d, max_context=128)
    new = synthetic.state_dict("gemma4", seed=1)
    mm.update_weights(new)
    fresh = _fresh(di, tmp_path, "gemma4", new, "fresh")
    assert torch.equal(_bits(mm.teacher_forced_logits(IDS)), _bits(fresh.teacher_forced_logits(IDS)))
    with pytest.raises(ValueError, match="'model.layers.9.self_attn.k_proj.weight' is not a weight"):
        mm.update_weights({"model.layers.9.self_attn.k_proj.weight": torch.zeros(32, 128)})


def test_a_state_made_after_an_update_is_current(qwen2):
    """A state created after the update holds the new weights' K/V from its first position on, even
    when it is continued from a length set by hand (tests/test_long_context.py does)."""
    qwen2.update_weights({"model.norm.weight": torch.ones(128)})
    s = qwen2.new_state(64)
    s.length = 3
    assert qwen2.extend(IDS[3:6], s).shape == (1000,)
    assert s.length == 6


def test_states_filled_before_the_update_must_be_prefilled_again(qwen2):
    s = qwen2.new_state(64)
    qwen2.prefill(IDS[:10], s)
    qwen2.prefill(IDS[:10])  # the default state too
    qwen2.update_weights({"model.norm.weight": torch.ones(128)})
    with pytest.raises(ValueError, match="filled before update_weights"):
        qwen2.extend(IDS[10:12], s)
    with pytest.raises(ValueError, match="filled before update_weights"):
        qwen2.decode_batch([IDS[10]], [10], [s])
    assert qwen2.state.length == 0  # the default state was reset by the update
    again = qwen2.prefill(IDS[:10], s)
    assert torch.equal(qwen2.extend(IDS[10:12], s), qwen2.teacher_forced_logits(IDS[:12])[-1])
    assert again.shape == (1000,)


def test_certificates_refuse_an_updated_model(di, qwen2):
    qwen2.update_weights({"model.norm.weight": torch.ones(128)})
    with pytest.raises(ValueError, match="replaced by update_weights"):
        di.certificate.make(qwen2, IDS[:10], 4)


def test_nf4_and_gguf_models_are_refused(di, tmp_path):
    d = nf4_checkpoints.write_packed("qwen3", str(tmp_path / "nf4"), di.ops.nf4_codebook())
    nf4 = di.MegaModel.from_pretrained(d)
    with pytest.raises(ValueError, match="does not take nf4 models"):
        nf4.update_weights({"model.norm.weight": torch.ones(128)})
    path, _ = write_gguf("qwen2", "F32", str(tmp_path))
    gguf = di.MegaModel.from_gguf(path)
    with pytest.raises(ValueError, match="does not take GGUF models"):
        gguf.update_weights({"model.norm.weight": torch.ones(128)})
