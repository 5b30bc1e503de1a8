"""Gemma-4's text model (Gemma4ForCausalLM, E2B's architecture): what is particular to it.

The synthetic E2B-shaped model ("gemma4") is certified with the other models: its digests are
pinned in pins.py and reproduced under every variation by test_det_infer.py (which also checks it
against transformers in float64), by the emulated megakernel (test_megakernel_emulated.py) and by
the portable engine builds. Here: the per-layer geometry the config gives, E2B's real widths (head
size 512, MLP 12288, per-layer inputs of 256) against transformers in float64 on the CPU engine and
bit for bit on the emulated megakernel, and the config forms and refusals."""
import copy

import hf_reference
import pytest
from det_fixtures import synthetic
import torch

GEMMA4 = synthetic.CONFIGS["gemma4"]


@pytest.fixture(scope="module")
def g4(di, tmp_path_factory):
    directory = synthetic.write_checkpoint("gemma4", str(tmp_path_factory.mktemp("gemma4")))
    return {"dir": directory, "mm": di.MegaModel.from_pretrained(directory, max_context=512)}


def test_gemma4_layer_geometry(g4):
    cfg = g4["mm"].config
    rows = cfg.layer_rows()  # (window, rope table, head_dim, intermediate, kv source)
    assert [r[0] for r in rows] == [40, 40, 40, 40, 0] * 2
    assert [r[2] for r in rows] == [32, 32, 32, 32, 64] * 2
    assert [r[3] for r in rows] == [256] * 6 + [512] * 4  # double-wide MLPs on the KV-shared layers
    assert [r[4] for r in rows] == [0, 1, 2, 3, 4, 5, 5, 5, 5, 4]  # last sliding / full before layer 6
    assert cfg.rope_table_shapes() == [(8, 32), (16, 16)]  # full: 8 pairs (x_i, x_{i+32}); sliding: 16
    assert cfg.kv_floats_per_position() == 5 * 32 + 64  # layers 0-5 cache their own K/V


def test_gemma4_at_e2b_widths(di, tmp_path):
    """E2B's real layer sizes (hidden 1536, 8 heads over 1 KV head of 256 / 512, MLP 6144 and 12288
    on the shared layers, per-layer inputs of 256) for six layers; a 2048-token vocabulary (the
    vocabulary does not enter any layer's arithmetic)."""
    directory = synthetic.write_checkpoint(
        "gemma4", str(tmp_path / "e2b"), vocab_size=2048, vocab_size_per_layer_input=2048, hidden_size=1536,
        intermediate_size=6144, num_hidden_layers=6, num_attention_heads=8, head_dim=256, global_head_dim=512,
        hidden_size_per_layer_input=256, num_kv_shared_layers=1, sliding_window=512,
        layer_types=["sliding_attention"] * 4 + ["full_attention"] * 2)
    mm = di.MegaModel.from_pretrained(directory, max_context=64)
    assert [r[2:] for r in mm.config.layer_rows()] == [(256, 6144, i) for i in range(4)] + [(512, 6144, 4),
                                                                                          (512, 12288, 4)]
    ids = synthetic.token_sequence(24, 2048, 5)
    ours = mm.teacher_forced_logits(ids).double()
    ref = hf_reference.logits_float64(hf_reference.load_float64(directory, mm._inv_freq, mm.config), ids)
    dev = (ours - ref).abs()
    print(f"gemma4 E2B widths: max {dev.max():.3g} mean {dev.mean():.3g} |ref| {ref.abs().mean():.3g}")
    assert dev.max() < 1e-4 and dev.mean() < 1e-5
    # The megakernel's device code (emulated): head size 512 takes two q slices per lane; a tile
    # of 4 rows and then one of 2.
    emulated = di.MegaModel.from_pretrained(directory, max_context=64, executor="emulated",
                                            geometry={"grid": 2, "warps": 4, "ring": 4, "tile_rows": 4, "seed": 5})
    assert torch.equal(emulated.teacher_forced_logits(ids[:6]), ours[:6].float())


# ---- config ----------------------------------------------------------------------------------------
def _config(di, **changes):
    d = copy.deepcopy(GEMMA4)
    d.update(changes)
    return di.ModelConfig.from_dict(d)


def test_gemma4_per_layer_config_form(di):
    """transformers 5 writes the full layers' head size as per-layer overrides, not global_head_dim."""
    d = copy.deepcopy(GEMMA4)
    del d["global_head_dim"]
    d["per_layer_config"] = {"04": {"head_dim": 64}, "09": {"head_dim": 64}}
    assert di.ModelConfig.from_dict(d).engine_ints() == _config(di).engine_ints()


@pytest.mark.parametrize("change,message", [
    ({"attention_k_eq_v": True}, "'attention_k_eq_v'"),
    ({"enable_moe_block": True}, "'enable_moe_block'"),
    ({"use_bidirectional_attention": "all"}, "'use_bidirectional_attention'"),
    ({"vocab_size_per_layer_input": 500}, "'vocab_size_per_layer_input' must equal 'vocab_size'"),
    ({"num_kv_shared_layers": 10}, "leaves no layer with its own K/V"),
    ({"layer_types": ["sliding_attention"] * 8 + ["full_attention"] * 2, "num_kv_shared_layers": 2},
     "no earlier layer of its attention type"),
    ({"final_logit_softcapping": -1.0}, "'final_logit_softcapping' must be a positive number"),
    ({"hidden_activation": "silu"}, "'hidden_activation' = 'silu' is not supported"),
])
def test_gemma4_config_refusals(di, change, message):
    with pytest.raises(ValueError, match=message):
        _config(di, **change)
