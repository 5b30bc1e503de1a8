"""Gemma-4's text model (Gemma4ForCausalLM, E2B's architecture) on the CPU engine.

Checked against transformers' own Gemma4ForCausalLM in float64 on the synthetic E2B-shaped model
and on E2B's real widths for a few layers, and under the invariance variations of the llama path
(each compared with the model's own one-prefill result: the digests are pinned once the megakernel
runs Gemma-4 too and agrees, docs/SPEC.md §13.7). The megakernel refuses Gemma-4 with a sentence."""
import copy

import hf_reference
import pytest
import synthetic
import torch
from certification import (N_GEN, N_TEACHER, batch_with_target, digests_on_threads, generation_digest, inputs_for,
                           logits_digest)

GEMMA4 = synthetic.CONFIGS["gemma4"]


@pytest.fixture(scope="module")
def g4(di, tmp_path_factory):
    directory = synthetic.write_checkpoint("gemma4", str(tmp_path_factory.mktemp("gemma4")))
    mm = di.MegaModel.from_pretrained(directory, max_context=512)
    teacher, prompt = inputs_for("gemma4", directory, mm.config.vocab_size)
    tokens, logits = mm.generate(prompt, max_new=N_GEN, return_logits=True)
    return {"dir": directory, "mm": mm, "teacher": teacher, "prompt": prompt,
            "teacher_forced": logits_digest(mm.teacher_forced_logits(teacher)),
            "generation": generation_digest(tokens, logits), "tokens": tokens}


def test_gemma4_layer_geometry(g4):
    cfg = g4["mm"].config
    rows = cfg.layer_rows()  # (window, rope table, head_dim, intermediate, kv source)
    assert [r[0] for r in rows] == [40, 40, 40, 40, 0] * 2
    assert [r[2] for r in rows] == [32, 32, 32, 32, 64] * 2
    assert [r[3] for r in rows] == [256] * 6 + [512] * 4  # double-wide MLPs on the KV-shared layers
    assert [r[4] for r in rows] == [0, 1, 2, 3, 4, 5, 5, 5, 5, 4]  # last sliding / full before layer 6
    assert cfg.rope_table_shapes() == [(8, 32), (16, 16)]  # full: 8 pairs (x_i, x_{i+32}); sliding: 16
    assert cfg.kv_floats_per_position() == 5 * 32 + 64  # layers 0-5 cache their own K/V


def test_gemma4_matches_transformers_float64(g4):
    mm = g4["mm"]
    ids = synthetic.token_sequence(300, mm.config.vocab_size, 7)  # past the window, 3 chunks
    ours = mm.teacher_forced_logits(ids).double()
    ref = hf_reference.logits_float64(hf_reference.load_float64(g4["dir"], mm._inv_freq, mm.config), ids)
    dev = (ours - ref).abs()
    print(f"gemma4: max {dev.max():.3g} mean {dev.mean():.3g} |ref| {ref.abs().mean():.3g}")
    assert dev.max() < 1e-4 and dev.mean() < 1e-5
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_gemma4_at_e2b_widths(di, tmp_path):
    """E2B's real layer sizes (hidden 1536, 8 heads over 1 KV head of 256 / 512, MLP 6144 and 12288
    on the shared layers, per-layer inputs of 256) for six layers; a 2048-token vocabulary (the
    vocabulary does not enter any layer's arithmetic)."""
    cfg = dict(copy.deepcopy(GEMMA4), vocab_size=2048, vocab_size_per_layer_input=2048, hidden_size=1536,
               intermediate_size=6144, num_hidden_layers=6, num_attention_heads=8, head_dim=256,
               global_head_dim=512, hidden_size_per_layer_input=256, num_kv_shared_layers=1, sliding_window=512,
               layer_types=["sliding_attention"] * 4 + ["full_attention"] * 2)
    synthetic.CONFIGS["gemma4-e2b-widths"] = cfg
    try:
        directory = synthetic.write_checkpoint("gemma4-e2b-widths", str(tmp_path / "e2b"))
    finally:
        del synthetic.CONFIGS["gemma4-e2b-widths"]
    mm = di.MegaModel.from_pretrained(directory, max_context=64)
    assert [r[2:] for r in mm.config.layer_rows()] == [(256, 6144, i) for i in range(4)] + [(512, 6144, 4),
                                                                                          (512, 12288, 4)]
    ids = synthetic.token_sequence(24, 2048, 5)
    ours = mm.teacher_forced_logits(ids).double()
    ref = hf_reference.logits_float64(hf_reference.load_float64(directory, mm._inv_freq, mm.config), ids)
    dev = (ours - ref).abs()
    print(f"gemma4 E2B widths: max {dev.max():.3g} mean {dev.mean():.3g} |ref| {ref.abs().mean():.3g}")
    assert dev.max() < 1e-4 and dev.mean() < 1e-5


# ---- the invariances, against the model's own results -------------------------------------------
def test_gemma4_token_by_token_and_split_prefill(g4):
    mm, ids = g4["mm"], g4["teacher"]
    state = mm.new_state(N_TEACHER)
    rows = torch.stack([mm.decode_step(t, p, state) for p, t in enumerate(ids)])
    assert logits_digest(rows) == g4["teacher_forced"]
    state = mm.new_state(N_TEACHER)
    parts = [mm.extend(ids[a:b], state, logits="all") for a, b in ((0, 23), (23, 41), (41, N_TEACHER))]
    assert logits_digest(torch.cat(parts)) == g4["teacher_forced"]


def test_gemma4_per_step_and_batch_of_16(g4):
    mm = g4["mm"]
    tokens, logits = mm.generate(g4["prompt"], max_new=N_GEN, single_launch=False, return_logits=True)
    assert generation_digest(tokens, logits) == g4["generation"]
    prompts, slot, _ = batch_with_target("co-prompts:gemma4", g4["prompt"], mm.config.vocab_size, 150)
    streams, logits = mm.generate_batch(prompts, max_new=N_GEN, return_logits=True)
    assert generation_digest(streams[slot], logits[slot]) == g4["generation"]
    assert len(set(g4["tokens"])) > 8  # a varied stream, not one token repeated


@pytest.mark.parametrize("threads", ["1", "2"])
def test_gemma4_thread_count(g4, threads):
    assert digests_on_threads(g4["dir"], g4["teacher"], g4["prompt"], threads) == (g4["teacher_forced"],
                                                                                   g4["generation"])


def test_gemma4_refused_by_the_megakernel(di, g4):
    mm = di.MegaModel.from_pretrained(g4["dir"], max_context=512, executor="emulated")
    with pytest.raises(ValueError, match="does not run Gemma-4's features yet"):
        mm.teacher_forced_logits(g4["teacher"][:4])


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
